"""Small engine-side envelopes from the seed: `<turn_meta>`, `<diagnostics>`, the truncation note.

Quoted by the seed and kept byte for byte: the `## Repo Working Set` lines and the advice line
(working_set.rs:717-738), the diagnostics block (lsp_diagnostics.rs:1-15) and the truncation
envelope (engine/context.rs:330-338). The `<turn_meta>` header lines (date, model, thinking tier)
are not quoted; ours are `Date: YYYY-MM-DD` and `Model: NAME (thinking: TIER)`.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from harness.types import Message

from .calls import call_arguments

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


@dataclass(frozen=True)
class Diagnostic:
    line: int
    col: int
    message: str
    severity: str = "ERROR"


def diagnostics_message(by_file: dict[str, list[Diagnostic]]) -> Message | None:
    """Every file's accumulated diagnostics flushed as one user message; None when there are none
    (a missing LSP must never block the agent, so absence is silent)."""
    blocks = [f'<diagnostics file="{path}">\n'
              + "".join(f"  {d.severity} [{d.line}:{d.col}] {d.message}\n" for d in diags) + "</diagnostics>"
              for path, diags in by_file.items() if diags]
    return {"role": "user", "content": "\n".join(blocks)} if blocks else None


def flush_diagnostics(messages: list[Message], spec: dict) -> list[Message]:
    """The edit's tool result as an editor with a language server returns it (`spec["result"]`,
    the build output left to the LSP), and its diagnostics flushed as one user message after that
    turn's tool results. `spec`: {"call_id", "result", "by_file": {path: [[line, col, message, severity]]}}."""
    i = next(k for k, m in enumerate(messages) if m["role"] == "tool" and m.get("tool_call_id") == spec["call_id"])
    out = list(messages)
    out[i] = {**out[i], "content": spec["result"]}
    end = next((k for k in range(i, len(out)) if out[k]["role"] != "tool"), len(out))
    flushed = diagnostics_message({path: [Diagnostic(*d) for d in diags] for path, diags in spec["by_file"].items()})
    return out[:end] + ([flushed] if flushed else []) + out[end:]


def truncate(text: str, max_chars: int, envelope: bool = True) -> str:
    """Keep the head of an over-long tool result and say how much went (envelope=False: cut
    silently, the control the envelope is measured against)."""
    if len(text) <= max_chars:
        return text
    note = f"\n(Original: {len(text)} chars, omitted: {len(text) - max_chars} chars.)" if envelope else ""
    return text[:max_chars] + note
