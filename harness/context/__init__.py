"""Conditions: pure functions (episode, condition config) -> the messages the model sees.

Each condition implements one context-engineering mechanism from the seed article. They never
mutate the episode; the trajectory before what a condition adds stays byte-identical.
"""
from __future__ import annotations

from typing import Any, Callable

from harness.types import Episode, Message

from .status import status_block

Condition = Callable[[Episode, Any], list[Message]]


def none(episode: Episode, cfg: Any) -> list[Message]:
    return [dict(m) for m in episode.messages]


def status_tail(episode: Episode, cfg: Any) -> list[Message]:
    """The seed's default: the status as a separate user-role message at the very end."""
    return none(episode, cfg) + [{"role": "user", "content": status_block(episode.messages, episode.rule, cfg.format)}]


CONDITIONS: dict[str, Condition] = {"none": none, "status_tail": status_tail}


def apply(episode: Episode, cfg: Any) -> list[Message]:
    return CONDITIONS[cfg.kind](episode, cfg)
