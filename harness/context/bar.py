"""The status bar as a mechanism: where its facts come from, where it is placed, how it is updated
across turns, and the step that puts it into what the model sees (the last step of every condition,
so a bar never starts a guard turn and never receives `<turn_meta>`).

Facts always come from the full trajectory so far (the engine's state), whatever the model is shown
of it; `source: model` takes its text from a writer model at run time (harness.flow.writer), placed
by this same step.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Callable

from harness.errors import require
from harness.registry import Registry
from harness.types import Episode, Message

from .status import RENDERERS, StatusFacts, Wrapper, corrupt, tag, tally
from .switch import Switch
from .transcript import Transcript

REGION = "status"


class BarFormat(StrEnum):
    kv = "kv"  # key-value lines with the constraint check
    prose = "prose"  # the seed's one-line sentence


class Placement(StrEnum):
    tail = "tail"  # a user message at the end
    head = "head"  # merged into the system prompt
    mid = "mid"  # a system message just before the last user turn


class BarSource(StrEnum):
    code = "code"  # ground truth counted from the trajectory
    corrupted = "corrupted"  # corrupt_fraction of the facts off by one
    model = "model"  # two-stage: a writer model writes it (harness.flow.writer)


class Update(StrEnum):
    replace = "replace"  # only the latest bar (removed and appended anew every turn)
    append = "append"  # every turn's bar stays where it was appended


class Cadence(StrEnum):
    """At which turn ends (each model call that follows tool results, and the last) a bar is shown:
    reminders that fire every turn cost tokens and prompt-cache hits."""
    every = "every"  # at every turn end (the seed's)
    every_k = "every_k"  # at every k-th turn end (`cadence_k`), counted from the trajectory's first
    on_change = "on_change"  # when its text differs from the last bar shown
    at_limit = "at_limit"  # only once the rule's target is at or past its limit (call-limit families)


@dataclass
class StatusBarConfig(Switch):
    format: BarFormat = BarFormat.kv
    # mid: a template may reject a mid-conversation system message -> `error` record
    placement: Placement = Placement.tail
    wrapper: Wrapper = Wrapper.none
    internal: bool = False  # visibility="internal" on the <agent_status> tag
    source: BarSource = BarSource.code
    corrupt_fraction: float = 0.25  # source=corrupted
    side_channel: bool = False  # add volatile signals (minute time, duration, retries) to the bar
    # false: the same names and counts without the limit statement (status_vocab: controls for the bar's words)
    limit: bool = True
    update: Update = Update.replace
    writer_overrides: list[str] = field(default_factory=list)  # source=model: Hydra overrides for the writer; [] = the run's own
    writer_max_new_tokens: int = 96
    cadence: Cadence = Cadence.every
    cadence_k: int = 2  # cadence=every_k

    def __post_init__(self) -> None:
        require(self.update == Update.replace or self.placement == Placement.tail, "condition.status.update",
                "append needs placement=tail (each turn's bar stays where it was appended)")
        require(self.source != BarSource.model or self.update == Update.replace, "condition.status.source",
                "model-written bars are written once, for the last turn: use update=replace")
        require(self.writer_max_new_tokens >= 1, "condition.status.writer_max_new_tokens",
                f"must be >= 1, got {self.writer_max_new_tokens}")
        require(0 < self.corrupt_fraction <= 1, "condition.status.corrupt_fraction",
                f"must be in (0, 1], got {self.corrupt_fraction}")
        require(self.cadence_k >= 1, "condition.status.cadence_k", f"must be >= 1, got {self.cadence_k}")


def check_cadence(cfg: StatusBarConfig, episode: Episode) -> str | None:
    """Why the cadence cannot run on the family's episodes, or None."""
    if cfg.cadence == Cadence.at_limit and episode.rule is None:
        return f"at_limit needs a call limit, and the {episode.family} family has none"
    return None


def volatile_signals(episode: Episode) -> dict[str, str]:
    """Side-channel signals the seed keeps out of the model's context: a minute timestamp, the
    last call's duration, a retry count. Seeded by the episode id so prompts are reproducible."""
    rng = random.Random(f"volatile:{episode.id}")
    return {"time": f"{rng.randrange(24):02d}:{rng.randrange(60):02d} UTC",
            "last call duration": f"{rng.uniform(0.4, 60):.1f} s", "retries": str(rng.randrange(4))}


FactSource = Callable[[Episode, StatusBarConfig, list[Message]], StatusFacts]
# source -> the facts a bar shows; a source not here supplies none (model: the writer's text)
FACT_SOURCES: Registry[FactSource] = Registry("bar fact source")


@FACT_SOURCES.register(BarSource.code)
def code_facts(episode: Episode, cfg: StatusBarConfig, messages: list[Message]) -> StatusFacts:
    return tally(messages, episode.rule, episode.target)


@FACT_SOURCES.register(BarSource.corrupted)
def corrupted_facts(episode: Episode, cfg: StatusBarConfig, messages: list[Message]) -> StatusFacts:
    return corrupt(code_facts(episode, cfg, messages), cfg.corrupt_fraction, episode.id, tuple(episode.status_facts))


def wrap(body: str, cfg: StatusBarConfig) -> str:
    """A bar's body in the condition's tags (format, visibility, wrapper)."""
    return tag(body, cfg.format, internal=cfg.internal, wrapper=cfg.wrapper)


def bar_text(episode: Episode, cfg: StatusBarConfig, upto: int | None = None) -> str | None:
    """The rendered bar as of episode message `upto` (default: the end), or None when the source
    supplies no facts."""
    if cfg.source not in FACT_SOURCES:
        return None
    facts = FACT_SOURCES.get(cfg.source)(episode, cfg, episode.messages[:upto])
    if cfg.side_channel:
        facts = replace(facts, volatile=volatile_signals(episode))
    if not cfg.limit:
        facts = replace(facts, limit_shown=False)
    return wrap(RENDERERS[cfg.format](facts, tuple(episode.status_facts)), cfg)


def place(t: Transcript, text: str, placement: Placement) -> None:
    if placement == Placement.head:  # merged into the system prompt: the prefix changes from byte 0
        if t.messages and t.messages[0]["role"] == "system":
            t.extend(0, text, REGION)
        else:
            t.insert(0, {"role": "system", "content": text}, REGION)
    elif placement == Placement.mid:  # a system message just before the last user turn
        last_user = max(i for i, m in enumerate(t.messages) if m["role"] == "user")
        t.insert(last_user, {"role": "system", "content": text}, REGION)
    else:
        t.append({"role": "user", "content": text}, REGION)


def turn_ends(messages: list[Message]) -> list[int]:
    """Where the agent's turns end: after each run of tool results, and at the end."""
    ends = [i + 1 for i, m in enumerate(messages[:-1]) if m["role"] == "tool" and messages[i + 1]["role"] != "tool"]
    return ends + [len(messages)]


def _position(t: Transcript, end: int) -> int:
    """Where episode turn end `end` falls in the transcript: after the last message shown from
    before it and whatever a mechanism added right after that (a diagnostics flush)."""
    pos = max((k + 1 for k, o in enumerate(t.origins) if o is not None and o < end), default=0)
    while pos < len(t) and t.origins[pos] is None:
        pos += 1
    return pos


def cadence(episode: Episode, cfg: StatusBarConfig) -> list[bool]:
    """Per turn end of the episode, whether the bar is shown there."""
    ends = turn_ends(episode.messages)
    if cfg.cadence == Cadence.every:
        return [True] * len(ends)
    if cfg.cadence == Cadence.every_k:
        return [j % cfg.cadence_k == 0 for j in range(len(ends))]
    if cfg.cadence == Cadence.at_limit:  # never, where no limit is kept (a plan refuses it: check_cadence)
        rule, target = episode.rule, episode.target
        if rule is None:
            return [False] * len(ends)
        return [tally(episode.messages[:end], rule, target).calls_by_target.get(target, 0) >= rule.limit for end in ends]
    shown, last = [], None  # on_change: against the last bar shown, the first always
    for end in ends:
        text = bar_text(episode, replace(cfg, cadence=Cadence.every), end)
        shown.append(text != last)
        last = text if text != last else last
    return shown


def shows_now(episode: Episode, cfg: StatusBarConfig) -> bool:
    """Whether the prompt at the episode's end shows a bar (a writer model writes one only then)."""
    return cadence(episode, cfg)[-1]


def step(episode: Episode, t: Transcript, cfg: StatusBarConfig, text: str | None = None) -> None:
    """`text`: a bar written elsewhere (a writer model's, already wrapped); by default the source's
    facts make it. update=append: every turn end the cadence shows keeps the bar it was given; the
    last one is `text`. update=replace: the last turn end's bar, where the cadence shows it."""
    shown = cadence(episode, cfg)
    text = text if text is not None else bar_text(episode, cfg)
    if text is None:
        return
    if cfg.update != Update.append:
        if shown[-1]:
            place(t, text, cfg.placement)
        return
    ends = turn_ends(episode.messages)
    for end, show in reversed(list(zip(ends, shown))):  # from the last, so earlier positions stay valid
        bar = text if end == ends[-1] else bar_text(episode, cfg, end)
        if bar and show:
            t.insert(_position(t, end) if end != ends[-1] else len(t), {"role": "user", "content": bar}, REGION)
