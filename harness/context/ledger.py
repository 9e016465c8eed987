"""The injection ledger (seed: engine/mod.rs:2968-2984, knowledge/budget.rs, session.rs:22-23).

Before anything is reinjected: byte-level dedup against the current transcript, then a budget
dry-run (estimate the tokens with the candidate added; over budget, skip). Quotas bound what
memory recall and file-read previews may add per turn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from harness.errors import require
from harness.types import Episode, Message, canonical_json

from .calls import call_arguments
from .history import Bridge, History, project, summary
from .switch import Switch

REGION = "ledger"

MAX_RECALLED_ITEMS = 5
MAX_ITEM_LINES = 30
MAX_ITEM_BYTES = 10 * 1024
MAX_READ_PREVIEWS = 12
PREVIEW_CHARS = 1200
PREVIEW_ADVICE = "Treat these as reminders only; re-read files before making claims."


def estimate_tokens(messages: list[Message]) -> int:
    """A tokenizer-free estimate (4 characters a token); pass a real counter for exact budgets."""
    return sum(len(canonical_json(m)) for m in messages) // 4


def already_sent(sent: list[str], text: str) -> bool:
    """Byte-level dedup: `text` is identical to something already in the transcript."""
    return any(s == text for s in sent)


@dataclass
class LedgerConfig(Switch):
    """Recalled items and the last file reads' previews reinjected after compaction (`history:
    compacted`), each admitted by the ledger: byte dedup, then a dry-run against the token budget."""

    budget_tokens: int = 6000

    def __post_init__(self) -> None:
        require(self.budget_tokens >= 1, "condition.ledger.budget_tokens", f"must be >= 1, got {self.budget_tokens}")


@dataclass
class Ledger:
    budget_tokens: int
    count_tokens: Callable[[list[Message]], int] = estimate_tokens

    def admit(self, transcript: list[Message], candidate: Message) -> str:
        """'duplicate', 'over_budget' or 'ok' (only then should the candidate be appended)."""
        if already_sent([m.get("content") or "" for m in transcript], candidate.get("content") or ""):
            return "duplicate"
        if self.count_tokens(transcript + [candidate]) > self.budget_tokens:
            return "over_budget"
        return "ok"

    def inject(self, transcript: list[Message], candidate: Message) -> list[Message]:
        return transcript + [candidate] if self.admit(transcript, candidate) == "ok" else transcript


def cap_item(text: str) -> str:
    """One recalled item: at most 30 lines and 10 KB (cut on a character boundary)."""
    text = "\n".join(text.split("\n")[:MAX_ITEM_LINES])
    data = text.encode("utf-8")
    return data[:MAX_ITEM_BYTES].decode("utf-8", errors="ignore") if len(data) > MAX_ITEM_BYTES else text


def recalled_items(items: list[str]) -> list[str]:
    return [cap_item(t) for t in items[:MAX_RECALLED_ITEMS]]


def read_previews(reads: list[tuple[str, str]]) -> str:
    """The last 12 file reads, 1,200 characters each, closed by the seed's advice line. The
    layout around the previews is ours; the seed quotes only the advice."""
    recent = reads[-MAX_READ_PREVIEWS:]
    blocks = [f"### {path}\n{content[:PREVIEW_CHARS]}" for path, content in recent]
    return "## Recent file reads\n\n" + "\n\n".join(blocks) + f"\n\n{PREVIEW_ADVICE}"


def file_reads(messages: list[Message], tool: str = "read_file") -> list[tuple[str, str]]:
    """(path, result) of every read_file call whose result is in `messages`, in order."""
    paths = {c.get("id"): call_arguments(c).get("path") for m in messages for c in m.get("tool_calls") or []
             if c["function"]["name"] == tool}
    return [(str(paths[m.get("tool_call_id")]), m.get("content") or "") for m in messages
            if m["role"] == "tool" and m.get("tool_call_id") in paths]


def reminder(text: str) -> Message:
    """A reinjection: a user message in the `<system-reminder>` shell (the compaction reinjection's)."""
    return {"role": "user", "content": f"<system-reminder>\n{text}\n</system-reminder>"}


def reinjections(messages: list[Message], recalled: list[str]) -> list[Message]:
    """The candidates for reinjection, in the order they are tried: recalled memory items (the
    quotas applied; the layout is ours) and the file-read previews; an empty class is no candidate."""
    items = recalled_items(recalled)
    reads = file_reads(messages)
    return ([reminder("## Recalled items\n\n" + "\n".join(f"- {t}" for t in items))] if items else []) + (
        [reminder(read_previews(reads))] if reads else [])


def bridge(episode: Episode, cfg: LedgerConfig) -> Bridge:
    """The summary, then each reinjection candidate the ledger admits against the transcript as it
    would stand with it (a candidate that fails the dedup or the budget is skipped)."""
    ledger, out = Ledger(cfg.budget_tokens), summary(episode)
    for candidate in reinjections(episode.messages, episode.facts.get("recall", [])):
        if ledger.admit(project(episode, History.compacted, out).messages, candidate) == "ok":
            out.append((candidate, REGION))
    return out
