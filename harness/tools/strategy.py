"""`python -m harness.tools.strategy [--episodes N] [overrides]`: prompt tokens per turn and the
tokens each update strategy (replace, append, reflow) shares with the previous turn's prompt,
tokenized with the configured model's own chat template (the embedded model by default)."""
from __future__ import annotations

import argparse
from typing import Any, Callable

import scenarios
from harness.config.compose import compose_config, user_errors
from harness.context.bar import StatusBarConfig
from harness.context.strategy import reuse_table
from harness.models import sources
from harness.render import PromptRenderer
from harness.types import Message


def prompt_tokenizer(tokenizer: Any, model_cfg: Any) -> Callable[[list[Message], list[dict[str, Any]]], list[int]]:
    """Token ids of the prompt exactly as the backends render it (tools, generation prompt included)."""
    render = PromptRenderer(tokenizer, model_cfg)
    return lambda messages, tools: tokenizer(render(messages, tools), add_special_tokens=False)["input_ids"]


def hf_tokenizer(model_cfg: Any) -> Callable[[list[Message], list[dict[str, Any]]], list[int]]:
    """`prompt_tokenizer` with the configured model's own tokenizer."""
    from transformers import AutoTokenizer

    path, revision = sources.resolve(model_cfg)
    return prompt_tokenizer(AutoTokenizer.from_pretrained(path, revision=revision if not model_cfg.packaged else None), model_cfg)


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    parser = argparse.ArgumentParser(prog="python -m harness.tools.strategy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1, help="how many episodes of the grid (from the first)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (scenario=..., model=..., the bar's format via "
                        "conditions.status_tail.format=prose)")
    args = parser.parse_intermixed_args(argv)
    with user_errors():
        cfg = compose_config(args.overrides)
    bar_cfg = next((c.status for c in cfg.conditions.values() if c.status), StatusBarConfig())
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
