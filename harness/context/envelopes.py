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

    def render(self) -> str:
        lines = ["## Repo Working Set", f"Workspace: {self.workspace}"]
        if self.key_files:
            lines.append("Key files: " + ", ".join(self.key_files))
        if self.top_dirs:
            lines.append("Top-level directories: " + ", ".join(f"{d}/" for d in self.top_dirs))
        lines.append("Active paths (prioritize these):")
        lines += [f"- {p} (file)" for p in self.active]
        lines.append(WORKING_SET_ADVICE)
        return "\n".join(lines)


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


def truncate(text: str, max_chars: int) -> str:
    """Keep the head of an over-long tool result and say how much went."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n(Original: {len(text)} chars, omitted: {len(text) - max_chars} chars.)"
