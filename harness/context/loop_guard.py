"""The seed's loop guard (engine/loop_guard.rs): identical-call blocking and failure streaks.

The block message is the seed's, byte for byte. The seed names the warn and halt thresholds but
does not quote their texts; WARN_MESSAGE and HALT_MESSAGE are ours. Every answer of the guard
goes back as the tool result of the call that triggered it, never as a separate message.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.types import Message, canonical_json, sha256

from .calls import call_arguments

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
    any value (a pagination offset) does."""
    return sha256(canonical_json({"tool": tool, "arguments": arguments}))


def is_failure(result: str) -> bool:
    """Our convention for plain chat logs, which carry no error flag: a result that starts with
    `Error` (any case) failed."""
    return result.lstrip().lower().startswith("error")


@dataclass
class LoopGuard:
    seen: Counter = field(default_factory=Counter)
    failures: int = 0

    def new_turn(self) -> None:
        self.seen.clear()  # identical calls are counted per turn; the failure streak spans turns

    def check(self, tool: str, arguments: Any) -> str | None:
        """Before executing a call: the block message, or None when the call may run."""
        key = call_hash(tool, arguments)
        if self.seen[key] >= IDENTICAL_CALL_BLOCK_THRESHOLD - 1:
            return BLOCK_MESSAGE.format(tool=tool, count=self.seen[key])
        self.seen[key] += 1
        return None

    def record(self, failed: bool) -> str | None:
        """After a call ran: the warn or halt message the streak has reached, or None."""
        self.failures = self.failures + 1 if failed else 0
        if self.failures >= FAILURE_HALT_THRESHOLD:
            return HALT_MESSAGE.format(count=self.failures)
        if self.failures >= FAILURE_WARN_THRESHOLD:
            return WARN_MESSAGE.format(count=self.failures)
        return None


def guard_trajectory(messages: list[Message]) -> list[Message]:
    """Replay a trajectory through the guard: a blocked call's result becomes the block message,
    a failing result gets the warn/halt line appended. A user message starts a new turn."""
    guard, out, verdicts = LoopGuard(), [], {}
    for m in messages:
        m = dict(m)
        if m["role"] == "user":
            guard.new_turn()
        for call in m.get("tool_calls") or []:
            verdicts[call["id"]] = guard.check(call["function"]["name"], call_arguments(call))
        if m["role"] == "tool" and m.get("tool_call_id") in verdicts:
            blocked = verdicts.pop(m["tool_call_id"])
            if blocked is not None:
                m["content"] = blocked
            else:
                note = guard.record(is_failure(m.get("content") or ""))
                if note:
                    m["content"] = f"{m.get('content') or ''}\n\n{note}"
        out.append(m)
    return out
