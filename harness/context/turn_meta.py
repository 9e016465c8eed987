"""`<turn_meta>`: the first block of every new user message (the seed's working_set.rs:717-738).

Quoted by the seed and kept byte for byte: the `## Repo Working Set` lines and the advice line. The
header lines (date, model, thinking tier) are not quoted; ours are `Date: YYYY-MM-DD` and
`Model: NAME (thinking: TIER)`. A block byte-identical to one already sent is left out: the
day-granular date is what makes blocks of one day comparable.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from harness.errors import ConfigError, require
from harness.types import Episode, Message

from .calls import call_arguments
from .ledger import already_sent
from .switch import Switch
from .transcript import Transcript

REGION = "turn_meta"


@dataclass
class TurnMetaConfig(Switch):
    last_only: bool = False  # the block opens the last user message only
    date: str = "2026-01-15"  # fixed: prompts stay reproducible
    # the model and thinking tier the block names; the run fills them from model.* (harness.flow.plan.with_model)
    model: str = "auto"
    thinking: str = "auto"

    def __post_init__(self) -> None:
        try:
            dt.date.fromisoformat(self.date)
        except ValueError:
            raise ConfigError(f"condition.turn_meta.date: must be YYYY-MM-DD, got {self.date!r}") from None
        require(bool(self.model), "condition.turn_meta.model", "must not be empty")


WORKING_SET_ADVICE = "When in doubt, use tools to verify and keep changes focused on the working set."
PATH_KEYS = ("path", "file", "file_path", "filename")


def active_paths(messages: list[Message], limit: int = 8) -> list[str]:
    """Paths the trajectory's tool calls touched, most recent first, each once."""
    seen: list[str] = []
    for m in reversed(messages):
        for call in reversed(m.get("tool_calls") or []):
            args = call_arguments(call)
            for key in PATH_KEYS:
                value = args.get(key)
                if isinstance(value, str) and value not in seen:
                    seen.append(value)
    return seen[:limit]


@dataclass(frozen=True)
class WorkingSet:
    workspace: str
    key_files: tuple[str, ...] = ()
    top_dirs: tuple[str, ...] = ()
    active: tuple[str, ...] = ()
    dirs: frozenset[str] = frozenset()  # the active paths that are directories

    def render(self) -> str:
        lines = ["## Repo Working Set", f"Workspace: {self.workspace}"]
        if self.key_files:
            lines.append("Key files: " + ", ".join(self.key_files))
        if self.top_dirs:
            lines.append("Top-level directories: " + ", ".join(f"{d}/" for d in self.top_dirs))
        lines.append("Active paths (prioritize these):")
        lines += [f"- {p} ({'directory' if p in self.dirs else 'file'})" for p in self.active]
        lines.append(WORKING_SET_ADVICE)
        return "\n".join(lines)


def _relative(path: str, workspace: str) -> str:
    root = workspace.rstrip("/") + "/"
    return path[len(root):] if path.startswith(root) else path


def working_set(workspace: str, files: list[str], messages: list[Message]) -> WorkingSet:
    """The working set as of `messages`: key files (the workspace's top-level files) and top-level
    directories from its listing `files` (paths relative to the workspace, a directory ending in
    "/"), the paths the calls touched; a touched path is a directory when it ends in "/" or the
    listing has something under it."""
    parts = [f.split("/", 1) for f in files]
    key_files = tuple(p[0] for p in parts if len(p) == 1)
    top_dirs = tuple(dict.fromkeys(p[0] for p in parts if len(p) == 2))
    active = tuple(active_paths(messages))
    under = {"/".join(f.split("/")[:k]) for f in files for k in range(1, f.count("/") + 1)}
    dirs = frozenset(p for p in active if p.endswith("/") or _relative(p, workspace).rstrip("/") in under)
    return WorkingSet(workspace, key_files, top_dirs, active, dirs)


def turn_meta(date: dt.date | dt.datetime, model: str, thinking: str, working_set: WorkingSet) -> str:
    """The first block of a new user message. A datetime is cut to the day, so the block is
    byte-stable within a day (what lets the ledger dedupe it)."""
    day = date.date() if isinstance(date, dt.datetime) else date
    return (f"<turn_meta>\nDate: {day.isoformat()}\nModel: {model} (thinking: {thinking})\n"
            f"{working_set.render()}\n</turn_meta>")


def step(episode: Episode, t: Transcript, cfg: TurnMetaConfig) -> None:
    """`<turn_meta>` opens every user message (`last_only`: the last), with the working set as of
    that message (the calls shown before it)."""
    users = [i for i, m in enumerate(t.messages) if m["role"] == "user"]
    sent: list[str] = []
    for i in users[-1:] if cfg.last_only else users:
        ws = working_set(episode.workspace, episode.workspace_files, t.messages[:i])
        meta = turn_meta(dt.date.fromisoformat(cfg.date), cfg.model, cfg.thinking, ws)
        if already_sent(sent, meta):
            continue
        sent.append(meta)
        t.prepend(i, meta, REGION)
