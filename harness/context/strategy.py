"""Update strategies across a multi-turn trajectory, and the prefix-cache reuse each one allows.

At every turn end of an episode the agent sends a prompt: the trajectory so far plus, by strategy,
- replace: the latest bar only (the previous turn's bar is removed, the new one appended);
- append: every bar ever appended stays in place (Claude Code's <system-reminder> style);
- reflow: no bar at all (state reaches the model only through tool results).
The final turn's prompt of each strategy is what conditions status_tail / status_append / none
show the model, so accuracy comes from a normal run; this module measures the other half: how
many prompt tokens each turn shares with the previous turn's prompt (what a prefix cache reuses).

`python -m harness.tools.strategy` prints the table for a configured model.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from harness.types import Episode, Message

from .bar import Placement, StatusBarConfig, Update, turn_ends
from .pipeline import ConditionConfig, apply

STRATEGIES = ("replace", "append", "reflow")


def prompts_by_turn(episode: Episode, strategy: str, bar: StatusBarConfig) -> list[list[Message]]:
    """One prompt per turn end; `bar`'s settings (format, tags) apply to the bars shown."""
    shown = ConditionConfig() if strategy == "reflow" else \
        ConditionConfig(status=replace(bar, placement=Placement.tail, update=Update(strategy)))
    return [apply(replace(episode, messages=episode.messages[:end]), shown) for end in turn_ends(episode.messages)]


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reuse_table(episode: Episode, bar: StatusBarConfig, tokenize: Callable[[list[Message]], list[int]]) -> list[dict[str, Any]]:
    rows = []
    for strategy in STRATEGIES:
        previous: list[int] = []
        for turn, prompt in enumerate(prompts_by_turn(episode, strategy, bar), 1):
            ids = tokenize(prompt)
            shared = shared_prefix(previous, ids)
            rows.append({"episode": episode.id, "strategy": strategy, "turn": turn, "prompt_tokens": len(ids),
                         "shared_with_previous": shared, "new_tokens": len(ids) - shared})
            previous = ids
    return rows
