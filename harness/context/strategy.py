"""Update strategies across a multi-turn trajectory, and the prefix-cache reuse each one allows.

At every turn end of an episode the agent sends a prompt: the trajectory so far plus, by strategy,
- replace: the latest bar only (the previous turn's bar is removed, the new one appended);
- append: every bar ever appended stays in place (Claude Code's <system-reminder> style);
- reflow: no bar at all (state reaches the model only through tool results).
The final turn's prompt of each strategy is what conditions status_tail / status_append / none
show the model, so accuracy comes from a normal run; this module measures the other half: how
many prompt tokens each turn shares with the previous turn's prompt (what a prefix cache reuses).

`python -m harness.context.strategy [--episodes N] [overrides]` prints the table, tokenizing with
the configured model's own chat template (the embedded SmolLM2 by default).
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any, Callable

from harness.types import Episode, Message

from . import apply, turn_ends

STRATEGIES = ("replace", "append", "reflow")


def prompts_by_turn(episode: Episode, strategy: str, cfg: Any) -> list[list[Message]]:
    """One prompt per turn end; `cfg` is a ConditionConfig whose bar settings (format, tags) apply."""
    prompts = []
    for end in turn_ends(episode.messages):
        prefix = replace(episode, messages=episode.messages[:end])
        if strategy == "reflow":
            prompts.append(apply(prefix, replace(cfg, kind="none")))
        else:
            prompts.append(apply(prefix, replace(cfg, kind="status", placement="tail", history="full", update=strategy)))
    return prompts


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reuse_table(episode: Episode, cfg: Any, tokenize: Callable[[list[Message]], list[int]]) -> list[dict[str, Any]]:
    rows = []
    for strategy in STRATEGIES:
        previous: list[int] = []
        for turn, prompt in enumerate(prompts_by_turn(episode, strategy, cfg), 1):
            ids = tokenize(prompt)
            shared = shared_prefix(previous, ids)
            rows.append({"episode": episode.id, "strategy": strategy, "turn": turn, "prompt_tokens": len(ids),
                         "shared_with_previous": shared, "new_tokens": len(ids) - shared})
            previous = ids
    return rows


def prompt_tokenizer(tokenizer: Any, model_cfg: Any) -> Callable[[list[Message], list[dict[str, Any]]], list[int]]:
    """Token ids of the prompt exactly as the backends render it (tools, generation prompt included)."""
    from harness.render import PromptRenderer

    render = PromptRenderer(tokenizer, model_cfg)
    return lambda messages, tools: tokenizer(render(messages, tools), add_special_tokens=False)["input_ids"]


def hf_tokenizer(model_cfg: Any) -> Callable[[list[Message], list[dict[str, Any]]], list[int]]:
    """`prompt_tokenizer` with the configured model's own tokenizer."""
    from transformers import AutoTokenizer

    from harness import models

    path, revision = models.resolve(model_cfg)
    return prompt_tokenizer(AutoTokenizer.from_pretrained(path, revision=revision if not model_cfg.gguf_package else None), model_cfg)


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    import scenarios
    from harness.compose import compose_config, user_errors
    from harness.config import ConditionConfig

    parser = argparse.ArgumentParser(prog="python -m harness.context.strategy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1, help="how many episodes of the grid (from the first)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (scenario=..., model=..., the bar's format via "
                        "conditions.status_tail.format=prose)")
    args = parser.parse_intermixed_args(argv)
    with user_errors():
        cfg = compose_config(args.overrides)
    bar_cfg = next((c for c in cfg.conditions.values() if c.kind == "status"), ConditionConfig(kind="status"))
    tokenize = hf_tokenizer(cfg.model)
    rows = []
    for ep in scenarios.build_episodes(cfg.scenario)[:args.episodes]:
        rows += reuse_table(ep, bar_cfg, lambda msgs, ep=ep: tokenize(msgs, ep.tools))
    df = pd.DataFrame(rows)
    per_turn = df.pivot_table(index=["episode", "turn"], columns="strategy", values=["prompt_tokens", "shared_with_previous"])
    per_turn.columns = [f"{strategy}: {'shared' if value == 'shared_with_previous' else 'prompt'}"
                        for value, strategy in per_turn.columns]
    print("Prompt tokens per turn and tokens shared with the previous turn's prompt:\n"
          + per_turn.reset_index().to_markdown(index=False))
    totals = df.groupby("strategy")[["prompt_tokens", "shared_with_previous", "new_tokens"]].sum()
    totals["reuse"] = (totals["shared_with_previous"] / totals["prompt_tokens"]).round(3)
    print("\nTotals over all turns (reuse = shared / prompt tokens):\n" + totals.to_markdown())


if __name__ == "__main__":
    main()
