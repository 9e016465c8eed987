"""A condition: the projection of the trajectory, then an ordered chain of mechanism steps, each
switched on by its own small typed config (like inspect-ai's solver chain).

1. projection (`history`): the trajectory in full, without its raw call records, or compacted; a
   reinjection mechanism (`todo`, `ledger`) supplies what stands where compaction removed turns;
2. trajectory steps (`STEPS`, in order): an edit's `<diagnostics>` flush, over-long tool results
   cut, the loop guard over tool results, `<turn_meta>` on the user messages. They act before any
   bar exists, so a bar never starts a guard turn and never receives the turn meta;
3. the bar (`status`), placed and updated as its config says.

A new mechanism is one module (its config dataclass and `step(episode, transcript, cfg)`), one
field here and one line in `STEPS`, and a preset YAML. Nothing here mutates the episode.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Callable, Optional

from harness.errors import require
from harness.registry import Registry
from harness.types import Episode, Message

from . import bar, diagnostics, ledger, loop_guard, todo, truncation, turn_meta
from .bar import BarFormat, StatusBarConfig, Update
from .diagnostics import DiagnosticsConfig
from .history import History, project
from .ledger import LedgerConfig
from .loop_guard import LoopGuardConfig
from .switch import Switch
from .todo import TodoConfig
from .transcript import Transcript
from .truncation import TruncationConfig
from .turn_meta import TurnMetaConfig

Step = Callable[[Episode, Transcript, Any], None]

# the trajectory steps, in the order they run; the ConditionConfig field of the same name switches each on
STEPS: Registry[Step] = Registry("condition step")
STEPS.add("diagnostics", diagnostics.step)
STEPS.add("truncation", truncation.step)
STEPS.add("loop_guard", loop_guard.step)
STEPS.add("turn_meta", turn_meta.step)


def _off(cls: type[Switch]) -> Any:
    return field(default_factory=lambda: cls(enabled=False))


@dataclass
class ConditionConfig:
    """Each mechanism's field is its config once built (None: off); in the schema every one is a
    node that is off until `enabled: true` (harness.context.switch)."""

    history: History = History.full
    todo: Optional[TodoConfig] = _off(TodoConfig)  # the TODO reinjected after compaction, or a new cycle's seed
    ledger: Optional[LedgerConfig] = _off(LedgerConfig)  # recalled items and read previews reinjected after compaction
    diagnostics: Optional[DiagnosticsConfig] = _off(DiagnosticsConfig)
    truncation: Optional[TruncationConfig] = _off(TruncationConfig)
    loop_guard: Optional[LoopGuardConfig] = _off(LoopGuardConfig)
    turn_meta: Optional[TurnMetaConfig] = _off(TurnMetaConfig)
    status: Optional[StatusBarConfig] = _off(StatusBarConfig)  # the <agent_status> bar

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Switch) and not value.enabled:
                require(value == type(value)(enabled=False), f"condition.{f.name}",
                        f"has settings but is off: add {f.name}.enabled=true to switch it on")
                setattr(self, f.name, None)
        require(not (self.todo and self.ledger), "condition.todo", "one reinjection per condition: todo or ledger")
        require(not (self.todo or self.ledger) or self.history == History.compacted, "condition.history",
                "a reinjection (todo, ledger) stands where compaction removed turns: set history=compacted")
        require(not self.status or self.status.update != Update.append or self.history == History.full,
                "condition.status.update", "append needs history=full (each turn's bar stays where it was appended)")

    @property
    def kind(self) -> str:
        """The condition's kind in one word: its reinjection, else whether it shows a bar."""
        if self.todo:
            return f"todo_{self.todo.reinject}"
        return "ledger" if self.ledger else "status" if self.status else "none"

    def identity(self) -> dict[str, Any]:
        """What decides the prompt, for sample ids and run fingerprints: the kind and the bar's format
        (the two keys the arms of the default ablation have always been identified by), the other
        mechanisms switched on, and every field set away from its default."""
        out: dict[str, Any] = {"kind": self.kind, "format": str(self.status.format if self.status else BarFormat.kv)}
        implied = {"todo", "ledger", "status"}  # named by kind
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "history":
                if value != History.full:
                    out["history"] = str(value)
            elif value is not None:
                changed = {k: v for k, v in _plain(dataclasses.asdict(value)).items()
                           if v != _plain(dataclasses.asdict(type(value)()))[k] and (f.name, k) != ("status", "format")}
                if changed or f.name not in implied:
                    out[f.name] = changed
        return out


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """Enum members by name (a wrapper's value is its template, not its name)."""
    return {k: v.name if isinstance(v, Enum) else v for k, v in d.items()}


def view(episode: Episode, cfg: ConditionConfig, bar_text: str | None = None) -> Transcript:
    """What the condition shows the model, annotated. `bar_text`: a bar written elsewhere (a writer
    model's, already wrapped)."""
    reinjection = todo.bridge(episode, cfg.todo) if cfg.todo else ledger.bridge(episode, cfg.ledger) if cfg.ledger else None
    t = project(episode, cfg.history, reinjection)
    for name, step in STEPS.items():
        step_cfg = getattr(cfg, name)
        if step_cfg is not None:
            step(episode, t, step_cfg)
    if cfg.status is not None:
        bar.step(episode, t, cfg.status, bar_text)
    return t


def apply(episode: Episode, cfg: ConditionConfig, bar_text: str | None = None) -> list[Message]:
    """The condition's messages (`view` without the annotations)."""
    return view(episode, cfg, bar_text).messages
