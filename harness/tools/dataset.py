"""Scenario grids as Hugging Face `datasets`: export, load back bit-identically, rebuild episodes.

One row per (episode, condition): every Episode field (structured ones as canonical JSON, so the
bytes survive Arrow's type inference unchanged), the condition's name and config, and the exact
messages the condition produces. `python -m harness.tools.dataset OUT [--format parquet|disk] [overrides]`
writes the grid of the composed config, so a frozen benchmark version can be published and rerun
(`scenario=traces scenario.path=OUT` rebuilds the same episodes, graded by their own family).
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import scenarios
from harness.config.compose import compose_config, user_errors
from harness.context import apply
from harness.flow.plan import with_model
from harness.types import Episode, canonical_json
from scenarios.rows import episode_row


def _features():
    from datasets import Features, Value

    types = {f.name: Value("string") for f in fields(Episode)}
    types["compact_at"] = types["guarded_from"] = Value("int64")
    return Features({**types, "condition": Value("string"), "condition_config": Value("string"), "prompt": Value("string")})


def grid_rows(cfg: Any) -> list[dict[str, Any]]:
    conditions = {name: with_model(ccfg, cfg.model) for name, ccfg in cfg.conditions.items()}
    return [{**episode_row(ep), "condition": name, "condition_config": canonical_json(asdict(ccfg)),
             "prompt": canonical_json(apply(ep, ccfg))}
            for ep in scenarios.build_episodes(cfg.scenario) for name, ccfg in conditions.items()]


def export(rows: list[dict[str, Any]], out: Path, fmt: str = "parquet") -> Path:
    """parquet: OUT/grid.parquet; disk: `save_to_disk(OUT)`. Returns what was written."""
    from datasets import Dataset

    ds = Dataset.from_list(rows, features=_features())
    if fmt == "parquet":
        out.mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(out / "grid.parquet"))
        return out / "grid.parquet"
    if fmt == "disk":
        ds.save_to_disk(str(out))
        return out
    raise ValueError(f"format: must be parquet or disk, got {fmt!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.dataset", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--format", choices=("parquet", "disk"), default="parquet")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for harness.run (scenario=..., condition=[...])")
    args = parser.parse_intermixed_args(argv)
    import datasets

    datasets.disable_progress_bars()
    with user_errors():
        rows = grid_rows(compose_config(args.overrides))
    print(f"statusbench: {len(rows)} rows -> {export(rows, args.out, args.format)}")


if __name__ == "__main__":
    main()
