"""Conditions: pure functions (episode, condition config) -> the messages the model sees.

Each condition implements one context-engineering mechanism from the seed article. They never
mutate the episode. The axes compose in a fixed order: history (full / bar only / compacted), the
kind's own projection (a status bar, the TODO reinjection after compaction, the cycle seed), then
the loop guard over tool results and `<turn_meta>` on the last user message.
"""
from __future__ import annotations

import datetime as dt
import random
from dataclasses import replace
from typing import Any, Callable

from harness.types import Episode, Message

from . import todo
from .envelopes import WorkingSet, active_paths, turn_meta
from .loop_guard import guard_trajectory
from .status import RENDERERS, StatusFacts, corrupt, status_block, tag, tally

Condition = Callable[[Episode, Any], list[Message]]


def _copy(messages: list[Message]) -> list[Message]:
    return [dict(m) for m in messages]


def _require_compaction(episode: Episode) -> int:
    if episode.compact_at is None:
        from harness.config import ConfigError

        raise ConfigError(f"condition.history: family {episode.family!r} has no compaction point; "
                          "use history=full or bar_only")
    return episode.compact_at


def history(episode: Episode, cfg: Any, seed: list[Message] | None = None) -> list[Message]:
    """The trajectory the projection starts from. `seed` replaces the summary after compaction
    (the cycle seed opens a new trajectory instead of summarizing the old one)."""
    msgs = episode.messages
    if cfg.history == "compacted" or seed is not None:
        cut = _require_compaction(episode)
        head = [m for m in msgs[:1] if m["role"] == "system"]
        bridge = seed if seed is not None else [{"role": "user", "content": episode.compaction_summary}]
        return _copy(head) + bridge + _copy(msgs[cut:])
    if cfg.history == "bar_only":
        return _copy([m for m in msgs if m["role"] != "tool" and not m.get("tool_calls")])
    return _copy(msgs)


def volatile_signals(episode: Episode) -> dict[str, str]:
    """Side-channel signals the seed keeps out of the model's context: a minute timestamp, the
    last call's duration, a retry count. Seeded by the episode id so prompts are reproducible."""
    rng = random.Random(f"volatile:{episode.id}")
    return {"time": f"{rng.randrange(24):02d}:{rng.randrange(60):02d} UTC",
            "last call duration": f"{rng.uniform(0.4, 60):.1f} s", "retries": str(rng.randrange(4))}


def facts(episode: Episode, cfg: Any, messages: list[Message]) -> StatusFacts:
    f = tally(messages, episode.rule, episode.target)
    kinds = tuple(episode.status_facts)
    if cfg.source == "corrupted":
        f = corrupt(f, cfg.corrupt_fraction, episode.id, kinds)
    if cfg.side_channel:
        f = replace(f, volatile=volatile_signals(episode))
    return f


def bar_text(episode: Episode, cfg: Any, upto: int | None = None) -> str | None:
    """The rendered bar as of message `upto` (default: the end); facts always come from the full
    trajectory so far (the engine's state), whatever the model is shown of it."""
    if cfg.source in ("none", "model"):  # a model-written bar is placed at run time (writer.py)
        return None
    body = RENDERERS[cfg.format](facts(episode, cfg, episode.messages[:upto]), tuple(episode.status_facts))
    return tag(body, cfg.format, internal=cfg.internal, reminder=cfg.wrapper == "system_reminder")


def place(messages: list[Message], text: str, placement: str) -> list[Message]:
    if placement == "head":  # merged into the system prompt: the prefix changes from byte 0
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}] + messages[1:]
        return [{"role": "system", "content": text}] + messages
    if placement == "mid":  # a system message just before the last user turn
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        return messages[:last_user] + [{"role": "system", "content": text}] + messages[last_user:]
    return messages + [{"role": "user", "content": text}]


def none(episode: Episode, cfg: Any) -> list[Message]:
    return history(episode, cfg)


def turn_ends(messages: list[Message]) -> list[int]:
    """Where the agent's turns end: after each run of tool results, and at the end."""
    ends = [i + 1 for i, m in enumerate(messages[:-1]) if m["role"] == "tool" and messages[i + 1]["role"] != "tool"]
    return ends + [len(messages)]


def status(episode: Episode, cfg: Any) -> list[Message]:
    """The `<agent_status>` bar computed from the trajectory, at the configured placement. With
    update=append every earlier turn keeps the bar it was given (persistent append); with
    update=replace only the latest bar is there (the previous one was removed).

    The loop guard and `<turn_meta>` act on the trajectory before any bar is placed (see `apply`),
    so a bar never starts a guard turn and a tail bar never receives the turn meta."""
    return _status(episode, cfg, lambda m: m)


def _status(episode: Episode, cfg: Any, post: Callable[[list[Message]], list[Message]]) -> list[Message]:
    text = bar_text(episode, cfg)
    if not text:
        return post(history(episode, cfg))
    if cfg.update == "append" and cfg.history == "full":
        projected = post(_copy(episode.messages))  # same length and order as episode.messages
        out: list[Message] = []
        start = 0
        ends = turn_ends(episode.messages)
        for end in ends:
            bar = text if end == ends[-1] else bar_text(episode, cfg, end)  # the final bar is `text`
            out += projected[start:end] + [{"role": "user", "content": bar}]
            start = end
        return out
    return place(post(history(episode, cfg)), text, cfg.placement)


def todo_compaction(episode: Episode, cfg: Any) -> list[Message]:
    """Compacted history with the TODO rebuilt as a `<system-reminder>` user message right after
    the summary (where the compaction landed), no ack."""
    return history(episode, cfg, seed=[{"role": "user", "content": episode.compaction_summary},
                                       todo.compaction_reminder(todo.replay(episode.messages))])


def todo_cycle(episode: Episode, cfg: Any) -> list[Message]:
    """A new cycle: the `[CYCLE STATE]` seed and its synthetic ack replace the old trajectory."""
    return history(episode, cfg, seed=todo.cycle_seed(todo.replay(episode.messages), episode.workspace))


CONDITIONS: dict[str, Condition] = {
    "none": none, "status": status,
    "status_tail": status,  # the foundation's name for status with placement=tail; kept for old configs
    "todo_compaction": todo_compaction, "todo_cycle": todo_cycle,
}


def _with_turn_meta(episode: Episode, cfg: Any, messages: list[Message]) -> list[Message]:
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    ws = WorkingSet(episode.workspace, active=tuple(active_paths(episode.messages)))
    # a condition knows no model: the tier is written as auto routing would leave it undecided
    meta = turn_meta(dt.date.fromisoformat(cfg.date), "auto", "auto", ws)
    out = list(messages)
    out[last_user] = {**out[last_user], "content": f"{meta}\n\n{out[last_user]['content']}"}
    return out


def apply(episode: Episode, cfg: Any) -> list[Message]:
    """The condition's messages. The loop guard and `<turn_meta>` run on the trajectory itself:
    for the status kinds before the bar is placed, so the bar's user messages neither reset the
    guard's per-turn count nor get the turn meta (everything before a tail bar is then identical
    to the none arm with the same loop_guard/turn_meta)."""
    def post(messages: list[Message]) -> list[Message]:
        if cfg.loop_guard:
            messages = guard_trajectory(messages)
        if cfg.turn_meta:
            messages = _with_turn_meta(episode, cfg, messages)
        return messages

    if CONDITIONS[cfg.kind] is status:
        return _status(episode, cfg, post)
    return post(CONDITIONS[cfg.kind](episode, cfg))


__all__ = ["CONDITIONS", "apply", "status_block", "bar_text", "place", "history", "turn_ends"]
