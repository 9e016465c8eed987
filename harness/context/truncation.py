"""Over-long tool results cut, with the seed's truncation envelope (engine/context.rs:330-338, byte for
byte) or silently (the control the envelope is measured against)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from harness.errors import require
from harness.types import Episode

from .switch import Switch
from .transcript import Transcript

REGION = "envelope"


class TruncationMode(StrEnum):
    silent = "silent"  # cut with nothing said
    envelope = "envelope"  # cut with (Original: N chars, omitted: M chars.)


@dataclass
class TruncationConfig(Switch):
    mode: TruncationMode = TruncationMode.envelope
    chars: int = 1500  # tool results longer than this are cut to it

    def __post_init__(self) -> None:
        require(self.chars >= 1, "condition.truncation.chars", f"must be >= 1, got {self.chars}")


def envelope(length: int, max_chars: int) -> str:
    return f"(Original: {length} chars, omitted: {length - max_chars} chars.)"


def truncate(text: str, max_chars: int, with_envelope: bool = True) -> str:
    """Keep the head of an over-long tool result and say how much went (or cut silently)."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + (f"\n{envelope(len(text), max_chars)}" if with_envelope else "")


def step(episode: Episode, t: Transcript, cfg: TruncationConfig) -> None:
    for i, m in enumerate(t.messages):
        text = m.get("content") or ""
        if m["role"] != "tool" or len(text) <= cfg.chars:
            continue
        t.cut(i, cfg.chars, REGION)
        if cfg.mode == TruncationMode.envelope:
            t.extend(i, envelope(len(text), cfg.chars), REGION, sep="\n")
