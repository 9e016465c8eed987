"""`python -m harness.tools.costs RUN_DIR [--models a,b] [--output-tokens N]`: what a run's grid would
cost on each priced model preset, at list and at batch prices, as a markdown table.

Prompt tokens are the run's own records' (the tokenizer of the model that ran it: a provider's tokenizer
counts the same text differently, Claude's from 4.7 on about 30% more than Haiku 4.5's); output tokens
per sample are --output-tokens (thinking and answer together: a frontier model's own length is not in a
small model's records). Every prompt token is billed as uncached input: the lower bound a prompt cache
could bring is not assumed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.config.compose import CONF_DIR, compose_config
from harness.errors import ConfigError
from harness.measure.cost import price
from harness.rundir.layout import RECORDS, run_parts
from harness.rundir.store import RunDirError, newest, read_jsonl


def priced_models() -> list[str]:
    """Every model preset with input and output prices and a batch discount."""
    names = []
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        model = compose_config([f"model={path.stem}"], check_machine=False).model
        if None not in (model.price_input_per_mtok, model.price_output_per_mtok, model.batch_discount):
            names.append(path.stem)
    return names


def table(run_dir: Path, models: list[str], output_tokens: int) -> str:
    records = newest(row for p in run_parts(Path(run_dir)) for row in read_jsonl(p / RECORDS, required=("sample_id",)))
    prompts = [r.get("prompt_tokens") for r in records.values()]
    if not prompts or any(not isinstance(p, int) for p in prompts):
        raise RunDirError(f"{run_dir}: every record needs a prompt token count ({sum(not isinstance(p, int) for p in prompts)} "
                          f"of {len(prompts)} have none)")
    lines = [f"{len(prompts)} samples, {sum(prompts):,} prompt tokens ({min(prompts)}-{max(prompts)} each, from {run_dir}), "
             f"{output_tokens} output tokens per sample assumed", "",
             "| model | input / cache write / cache read / output (USD per 1M) | context | list (USD) | batch (USD) |",
             "|---|---|---|---:|---:|"]
    for name in models:
        m = compose_config([f"model={name}"], check_machine=False).model
        listed = sum(price(m, p, 0, 0, output_tokens) for p in prompts)
        batched = sum(price(m, p, 0, 0, output_tokens, batched=True) for p in prompts)
        prices = " / ".join("n/a" if v is None else f"{v:g}" for v in (m.price_input_per_mtok, m.price_cache_write_per_mtok,
                                                                        m.price_cached_input_per_mtok, m.price_output_per_mtok))
        lines.append(f"| {name} | {prices} | {m.context_tokens:,} | {listed:.4f} | {batched:.4f} |" if m.context_tokens
                     else f"| {name} | {prices} | n/a | {listed:.4f} | {batched:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.costs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a run whose records hold prompt token counts (e.g. the default run)")
    parser.add_argument("--models", default=None, help="comma-separated model presets (default: every one with prices and a batch discount)")
    parser.add_argument("--output-tokens", type=int, default=500, help="output tokens per sample, thinking included (default 500)")
    args = parser.parse_args(argv)
    try:
        models = args.models.split(",") if args.models else priced_models()
        print(table(args.run_dir, models, args.output_tokens))
    except (ConfigError, RunDirError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
