"""The seed's loop guard (engine/loop_guard.rs): identical-call blocking and failure streaks.

The block message is the seed's, byte for byte. The seed names the warn and halt thresholds but
does not quote their texts; WARN_MESSAGE and HALT_MESSAGE are ours. Every answer of the guard
goes back as the tool result of the call that triggered it, never as a separate message.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.errors import require
from harness.types import Episode, canonical_json

from .calls import call_arguments
from .switch import Switch
from .transcript import Transcript

REGION = "loop_guard"

IDENTICAL_CALL_BLOCK_THRESHOLD = 3
FAILURE_WARN_THRESHOLD = 3
FAILURE_HALT_THRESHOLD = 8

BLOCK_MESSAGE = ("This call ({tool}) has already been made {count} times this turn with the same arguments — "
                 "try a different approach or change the arguments.")
WARN_MESSAGE = ("Warning: {count} consecutive tool calls have failed. Stop retrying the same thing; read the "
                "errors and change the approach, or report the problem.")
HALT_MESSAGE = ("Halted: {count} consecutive tool calls have failed. Stop calling tools and report the problem "
                "to the user.")


def call_hash(tool: str, arguments: Any) -> str:
    """Canonical JSON (keys sorted at every depth) of the call, hashed: key order never matters,
    any value (a pagination offset) does. A lone surrogate (`"\\ud83d"` in the model's arguments,
    valid JSON but no UTF-8) is hashed as its escape, so two different ones stay different."""
    text = canonical_json({"tool": tool, "arguments": arguments})
    return hashlib.sha256(text.encode("utf-8", errors="backslashreplace")).hexdigest()


def is_failure(result: str) -> bool:
    """Our convention for plain chat logs, which carry no error flag: a result that starts with
    `Error` (any case) failed."""
    return result.lstrip().lower().startswith("error")


@dataclass
class LoopGuardConfig(Switch):
    """The seed's thresholds: the third identical call in a turn is blocked, 3 failures in a row warn, 8 halt."""

    block_at: int = IDENTICAL_CALL_BLOCK_THRESHOLD
    warn_at: int = FAILURE_WARN_THRESHOLD
    halt_at: int = FAILURE_HALT_THRESHOLD

    def __post_init__(self) -> None:
        require(self.block_at >= 2, "condition.loop_guard.block_at", f"must be >= 2, got {self.block_at}")
        require(1 <= self.warn_at <= self.halt_at, "condition.loop_guard.warn_at",
                f"must be >= 1 and <= halt_at ({self.halt_at}), got {self.warn_at}")


@dataclass
class LoopGuard:
    cfg: LoopGuardConfig = field(default_factory=LoopGuardConfig)
    seen: Counter = field(default_factory=Counter)
    failures: int = 0

    def new_turn(self) -> None:
        self.seen.clear()  # identical calls are counted per turn; the failure streak spans turns

    def check(self, tool: str, arguments: Any) -> str | None:
        """Before executing a call: the block message, or None when the call may run."""
        key = call_hash(tool, arguments)
        if self.seen[key] >= self.cfg.block_at - 1:
            return BLOCK_MESSAGE.format(tool=tool, count=self.seen[key])
        self.seen[key] += 1
        return None

    def record(self, failed: bool) -> str | None:
        """After a call ran: the warn or halt message the streak has reached, or None."""
        self.failures = self.failures + 1 if failed else 0
        if self.failures >= self.cfg.halt_at:
            return HALT_MESSAGE.format(count=self.failures)
        if self.failures >= self.cfg.warn_at:
            return WARN_MESSAGE.format(count=self.failures)
        return None


def verdicts(messages: list, cfg: LoopGuardConfig) -> dict[int, tuple[str, bool]]:
    """The guard replayed over a trajectory: message index -> (its text, whether it is the whole
    result), for a blocked call's result (the block message) and a failing result that reached the
    warn or halt line. A user message starts a new turn."""
    guard, pending, out = LoopGuard(cfg), {}, {}
    for i, m in enumerate(messages):
        if m["role"] == "user":
            guard.new_turn()
        for call in m.get("tool_calls") or []:
            pending[call["id"]] = guard.check(call["function"]["name"], call_arguments(call))
        if m["role"] == "tool" and m.get("tool_call_id") in pending:
            blocked = pending.pop(m["tool_call_id"])
            if blocked is not None:
                out[i] = (blocked, True)
            elif note := guard.record(is_failure(m.get("content") or "")):
                out[i] = (note, False)
    return out


def step(episode: Episode, t: Transcript, cfg: LoopGuardConfig) -> None:
    """The guard's texts on the results the view shows: a blocked call's result becomes the block
    message, a failing result gets the warn/halt line appended. The whole trajectory is replayed
    (whatever the view keeps of it), and from `episode.guarded_from` on only: a rollout's
    environment guards the calls made live, not its opening."""
    found = verdicts(episode.messages, cfg)
    for k, origin in enumerate(t.origins):
        if origin is not None and origin >= episode.guarded_from and origin in found:
            text, whole = found[origin]
            if whole:
                t.replace(k, text, REGION)
            else:
                t.extend(k, text, REGION)
