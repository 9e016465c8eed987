"""Scenario grids as Hugging Face `datasets`: export, load back bit-identically, rebuild episodes.

One row per (episode, condition): every Episode field (structured ones as canonical JSON, so the
bytes survive Arrow's type inference unchanged), the condition's name and config, and the exact
messages the condition produces. `python -m harness.dataset OUT [--format parquet|disk] [overrides]`
writes the grid of the composed config, so a frozen benchmark version can be published and rerun
(`scenario=traces scenario.path=OUT` rebuilds the same episodes, graded by their own family).
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from harness.types import Episode, Rule, canonical_json

JSON_FIELDS = ("params", "messages", "tools", "rule", "facts", "tags", "status_facts", "workspace_files")


def _features():
    from datasets import Features, Value

    types = {f.name: Value("string") for f in fields(Episode)}
    types["compact_at"] = Value("int64")
    return Features({**types, "condition": Value("string"), "condition_config": Value("string"), "prompt": Value("string")})


def episode_row(episode: Episode) -> dict[str, Any]:
    row = asdict(episode)
    row["rule"] = asdict(episode.rule)
    return {k: canonical_json(v) if k in JSON_FIELDS else v for k, v in row.items()}


def row_episode(row: dict[str, Any], where: str = "row") -> Episode:
    """The Episode an exported row holds; ConfigError naming `where` and the field if it does not."""
    from harness.errors import ConfigError
    from harness.jsonl import parse_line

    values = {}
    for f in fields(Episode):
        if f.name not in row and f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{where}: exported episode lacks field {f.name!r}")
        if f.name in row:
            value = row[f.name]
            if f.name in JSON_FIELDS:
                if not isinstance(value, str):
                    raise ConfigError(f"{where}: field {f.name!r} must be JSON text, got {type(value).__name__}")
                value = parse_line(value, f"{where}, field {f.name!r}", 1, ConfigError)
            values[f.name] = value
    try:
        values["rule"] = Rule(**values["rule"])
        return Episode(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: not an exported episode ({exc})") from None


def grid_rows(cfg: Any) -> list[dict[str, Any]]:
    import scenarios
    from harness.context import apply
    from harness.plan import with_model

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


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a `.parquet` file, a `save_to_disk` folder, or a folder holding grid.parquet."""
    from datasets import Dataset, load_from_disk

    path = Path(path)
    if path.is_dir() and (path / "grid.parquet").exists():
        path = path / "grid.parquet"
    ds = Dataset.from_parquet(str(path)) if path.suffix == ".parquet" else load_from_disk(str(path))
    return ds.to_list()


def main(argv: list[str] | None = None) -> None:
    from harness.compose import compose_config, user_errors

    parser = argparse.ArgumentParser(prog="python -m harness.dataset", description=__doc__.split("\n\n")[0])
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
