"""Conditions: one pipeline of pure steps, (episode, condition config) -> the messages the model sees.

Every condition runs the same three stages, in this order:
1. projection (`KINDS[cfg.kind]`): the trajectory the model is shown: as is (optionally with the
   raw call records dropped, or compacted to a summary), or a TODO projection (reinjection after
   compaction, a new cycle's seed);
2. trajectory steps (`STEPS`, each switched on by the condition field of the same name): an edit's
   `<diagnostics>` flush, over-long tool results cut (with the truncation envelope or silently), the
   loop guard over tool results, `<turn_meta>` on the user messages. They act before any bar exists,
   so a bar never starts a guard turn and never receives the turn meta;
3. the bar, for the kinds that show one: its text comes from a source (`FACT_SOURCES`: code or
   corrupted facts; source=model gets its text from a writer model at run time, `writer.py`, and
   comes back through this same pipeline), placed by `placement` and `update`.

A new mechanism is one function plus one registry line (a kind, a step or a fact source) and, for a
step, the config switch of the same name. Nothing here mutates the episode.
"""
from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, replace
from typing import Any, Callable

from harness.errors import ConfigError
from harness.types import Episode, Message

from . import todo
from .envelopes import flush_diagnostics, truncate, turn_meta, working_set
from .ledger import Ledger, already_sent, reinjections
from .loop_guard import guard_trajectory
from .status import RENDERERS, StatusFacts, corrupt, tag, tally

Projection = Callable[[Episode, Any], list[Message]]
Step = Callable[[Episode, Any, list[Message]], list[Message]]


def _copy(messages: list[Message]) -> list[Message]:
    return [dict(m) for m in messages]


def history(episode: Episode, cfg: Any, seed: list[Message] | None = None) -> list[Message]:
    """The trajectory as `cfg.history` shows it. `seed` replaces the summary after compaction (the
    cycle seed opens a new trajectory instead of summarizing the old one)."""
    msgs = episode.messages
    if cfg.history == "compacted" or seed is not None:
        if episode.compact_at is None:
            raise ConfigError(f"condition.history: family {episode.family!r} has no compaction point; "
                              "use history=full or bar_only")
        head = [m for m in msgs[:1] if m["role"] == "system"]
        bridge = seed if seed is not None else [{"role": "user", "content": episode.compaction_summary}]
        return _copy(head) + bridge + _copy(msgs[episode.compact_at:])
    if cfg.history == "bar_only":
        return _copy([m for m in msgs if m["role"] != "tool" and not m.get("tool_calls")])
    return _copy(msgs)


def todo_compaction(episode: Episode, cfg: Any) -> list[Message]:
    """Compacted history with the TODO rebuilt as a `<system-reminder>` user message right after
    the summary (where the compaction landed), no ack."""
    return history(episode, cfg, seed=[{"role": "user", "content": episode.compaction_summary},
                                       todo.compaction_reminder(todo.replay(episode.messages))])


def todo_cycle(episode: Episode, cfg: Any) -> list[Message]:
    """A new cycle: the `[CYCLE STATE]` seed and its synthetic ack replace the old trajectory."""
    return history(episode, cfg, seed=todo.cycle_seed(todo.replay(episode.messages), episode.workspace))


def ledger_compaction(episode: Episode, cfg: Any) -> list[Message]:
    """Compacted history, then the reinjection candidates (recalled items, the last file reads'
    previews) after the summary, each through the ledger: byte dedup against the transcript, then
    the budget dry-run (`ledger_budget_tokens`); a candidate that fails either is skipped."""
    summary = [{"role": "user", "content": episode.compaction_summary}]
    ledger = Ledger(cfg.ledger_budget_tokens)
    admitted: list[Message] = []
    for candidate in reinjections(episode.messages, episode.facts.get("recall", [])):
        if ledger.admit(history(episode, cfg, seed=summary + admitted), candidate) == "ok":
            admitted.append(candidate)
    return history(episode, cfg, seed=summary + admitted)


@dataclass(frozen=True)
class Kind:
    project: Projection
    bar: bool = False  # whether the kind shows an <agent_status> bar


KINDS: dict[str, Kind] = {
    "none": Kind(history),
    "status": Kind(history, bar=True),
    "todo_compaction": Kind(todo_compaction),
    "todo_cycle": Kind(todo_cycle),
    "ledger": Kind(ledger_compaction),
}


def with_turn_meta(episode: Episode, cfg: Any, messages: list[Message]) -> list[Message]:
    """`<turn_meta>` opens every user message (`turn_meta_last_only`: the last), with the working set
    as of that message (the calls shown before it). A block byte-identical to one already sent is
    not sent again: the day-granular date is what makes blocks of one day comparable."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    out, sent = list(messages), []
    for i in users[-1:] if cfg.turn_meta_last_only else users:
        ws = working_set(episode.workspace, episode.workspace_files, messages[:i])
        meta = turn_meta(dt.date.fromisoformat(cfg.date), cfg.meta_model, cfg.meta_thinking, ws)
        if already_sent(sent, meta):
            continue
        sent.append(meta)
        out[i] = {**out[i], "content": f"{meta}\n\n{out[i]['content']}"}
    return out


def with_diagnostics(episode: Episode, cfg: Any, messages: list[Message]) -> list[Message]:
    """The family's edit reported through a `<diagnostics>` block; an episode without one is left
    as is (a missing language server never blocks the agent)."""
    spec = episode.facts.get("diagnostics")
    return flush_diagnostics(messages, spec) if spec else messages


def with_truncation(episode: Episode, cfg: Any, messages: list[Message]) -> list[Message]:
    """Tool results over `truncate_chars` cut, with the seed's envelope or silently."""
    return [{**m, "content": truncate(m["content"] or "", cfg.truncate_chars, envelope=cfg.truncation == "envelope")}
            if m["role"] == "tool" else m for m in messages]


STEPS: dict[str, Step] = {
    "diagnostics": with_diagnostics,
    "truncation": with_truncation,
    "loop_guard": lambda episode, cfg, messages: guard_trajectory(messages),
    "turn_meta": with_turn_meta,
}


def volatile_signals(episode: Episode) -> dict[str, str]:
    """Side-channel signals the seed keeps out of the model's context: a minute timestamp, the
    last call's duration, a retry count. Seeded by the episode id so prompts are reproducible."""
    rng = random.Random(f"volatile:{episode.id}")
    return {"time": f"{rng.randrange(24):02d}:{rng.randrange(60):02d} UTC",
            "last call duration": f"{rng.uniform(0.4, 60):.1f} s", "retries": str(rng.randrange(4))}


def code_facts(episode: Episode, cfg: Any, messages: list[Message]) -> StatusFacts:
    return tally(messages, episode.rule, episode.target)


def corrupted_facts(episode: Episode, cfg: Any, messages: list[Message]) -> StatusFacts:
    return corrupt(code_facts(episode, cfg, messages), cfg.corrupt_fraction, episode.id, tuple(episode.status_facts))


# source -> the facts a bar shows; sources not here supply no facts (none: no bar; model: the writer's text)
FACT_SOURCES: dict[str, Callable[[Episode, Any, list[Message]], StatusFacts]] = {
    "code": code_facts,
    "corrupted": corrupted_facts,
}


def wrap(body: str, cfg: Any) -> str:
    """A bar's body in the condition's tags (format, visibility, reminder wrapper)."""
    return tag(body, cfg.format, internal=cfg.internal, reminder=cfg.wrapper == "system_reminder")


def bar_text(episode: Episode, cfg: Any, upto: int | None = None) -> str | None:
    """The rendered bar as of message `upto` (default: the end), or None when the source supplies
    no facts. Facts always come from the full trajectory so far (the engine's state), whatever the
    model is shown of it."""
    source = FACT_SOURCES.get(cfg.source)
    if source is None:
        return None
    facts = source(episode, cfg, episode.messages[:upto])
    if cfg.side_channel:
        facts = replace(facts, volatile=volatile_signals(episode))
    return wrap(RENDERERS[cfg.format](facts, tuple(episode.status_facts)), cfg)


def place(messages: list[Message], text: str, placement: str) -> list[Message]:
    if placement == "head":  # merged into the system prompt: the prefix changes from byte 0
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}] + messages[1:]
        return [{"role": "system", "content": text}] + messages
    if placement == "mid":  # a system message just before the last user turn
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        return messages[:last_user] + [{"role": "system", "content": text}] + messages[last_user:]
    return messages + [{"role": "user", "content": text}]


def turn_ends(messages: list[Message]) -> list[int]:
    """Where the agent's turns end: after each run of tool results, and at the end."""
    ends = [i + 1 for i, m in enumerate(messages[:-1]) if m["role"] == "tool" and messages[i + 1]["role"] != "tool"]
    return ends + [len(messages)]


def append_bars(episode: Episode, cfg: Any, messages: list[Message], final: str) -> list[Message]:
    """update=append: every turn end keeps the bar it was given; the last one is `final`. `messages`
    is the full history after the trajectory steps (same length and order as the episode's)."""
    out: list[Message] = []
    start = 0
    ends = turn_ends(episode.messages)
    for end in ends:
        text = final if end == ends[-1] else bar_text(episode, cfg, end)
        out += messages[start:end] + ([{"role": "user", "content": text}] if text else [])
        start = end
    return out


def apply(episode: Episode, cfg: Any, bar: str | None = None) -> list[Message]:
    """The condition's messages. `bar`: a bar's text supplied from outside (a writer model's, already
    wrapped); by default the source's facts make it."""
    kind = KINDS[cfg.kind]
    messages = kind.project(episode, cfg)
    for name, step in STEPS.items():
        if getattr(cfg, name):
            messages = step(episode, cfg, messages)
    text = bar if bar is not None else bar_text(episode, cfg) if kind.bar else None
    if not kind.bar or text is None:
        return messages
    if cfg.update == "append":
        return append_bars(episode, cfg, messages, text)
    return place(messages, text, cfg.placement)


__all__ = ["KINDS", "STEPS", "FACT_SOURCES", "apply", "bar_text", "wrap", "place", "history", "turn_ends"]
