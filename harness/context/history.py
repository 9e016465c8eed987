"""The projection every condition starts from: the episode's trajectory shown in full, without its
raw call records, or compacted (the messages before the family's compaction point replaced by a
bridge: the episode's summary, or what a reinjection mechanism puts there)."""
from __future__ import annotations

from enum import StrEnum

from harness.errors import ConfigError
from harness.types import Episode, Message

from .transcript import Transcript

SUMMARY = "summary"  # the compaction summary a compacted history opens with

Bridge = list[tuple[Message, str]]  # messages that stand where compaction removed the old turns, with their regions


class History(StrEnum):
    full = "full"
    bar_only = "bar_only"  # raw call records (tool calls and results) dropped
    compacted = "compacted"  # summary (or a reinjection's bridge) + the turns after the compaction point


def summary(episode: Episode) -> Bridge:
    return [({"role": "user", "content": episode.compaction_summary}, SUMMARY)]


def project(episode: Episode, view: History, bridge: Bridge | None = None) -> Transcript:
    msgs = episode.messages
    if view == History.compacted:
        if episode.compact_at is None:
            raise ConfigError(f"condition.history: family {episode.family!r} has no compaction point; "
                              "use history=full or bar_only")
        head = [i for i in range(min(1, len(msgs))) if msgs[i]["role"] == "system"]
        t = Transcript.of([msgs[i] for i in head], head)
        for message, region in summary(episode) if bridge is None else bridge:
            t.append(message, region)
        kept = list(range(episode.compact_at, len(msgs)))
        tail = Transcript.of([msgs[i] for i in kept], kept)
        return Transcript(t.messages + tail.messages, t.origins + tail.origins, t.marks + tail.marks)
    keep = [i for i, m in enumerate(msgs) if view == History.full or (m["role"] != "tool" and not m.get("tool_calls"))]
    return Transcript.of([msgs[i] for i in keep], keep)
