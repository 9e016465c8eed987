"""LSP diagnostics: an edit's compiler errors flushed as one `<diagnostics file=...>` user message
after the edit (the seed's lsp_diagnostics.rs:1-15, byte for byte), instead of buried in the edit's
raw build output. A missing language server never blocks the agent: no diagnostics, no message."""
from __future__ import annotations

from dataclasses import dataclass

from harness.types import Episode, Message

from .switch import Switch
from .transcript import Transcript

REGION = "diagnostics"


@dataclass
class DiagnosticsConfig(Switch):
    """Switched on by being present (`diagnostics: {}`); the diagnostics come from the family's episode."""


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


def step(episode: Episode, t: Transcript, cfg: DiagnosticsConfig) -> None:
    """The edit's tool result as an editor with a language server returns it (`spec["result"]`,
    the build output left to the LSP), and its diagnostics flushed as one user message after that
    turn's tool results. The family's spec: `facts["diagnostics"]` = {"call_id", "result",
    "by_file": {path: [[line, col, message, severity]]}}; an episode without one is left as is."""
    spec = episode.facts.get("diagnostics")
    if not spec:
        return
    i = next(k for k, m in enumerate(t.messages) if m["role"] == "tool" and m.get("tool_call_id") == spec["call_id"])
    t.replace(i, spec["result"])  # still the edit's own result, as the editor returns it
    end = next((k for k in range(i, len(t)) if t.messages[k]["role"] != "tool"), len(t))
    flushed = diagnostics_message({path: [Diagnostic(*d) for d in diags] for path, diags in spec["by_file"].items()})
    if flushed:
        t.insert(end, flushed, REGION)
