"""Episodes as flat rows (structured fields as canonical JSON, so the bytes survive Arrow's type
inference unchanged), and rows read back from a `.parquet` file or a `save_to_disk` folder: the
exchange format of frozen grids (`harness.tools.dataset`) and of a user's traces (`scenarios.traces`)."""
from __future__ import annotations

from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.io.jsonl import parse_line
from harness.types import Episode, Rule, canonical_json

JSON_FIELDS = ("params", "messages", "tools", "rule", "facts", "tags", "status_facts", "workspace_files")


def episode_row(episode: Episode) -> dict[str, Any]:
    row = asdict(episode)
    return {k: canonical_json(v) if k in JSON_FIELDS else v for k, v in row.items()}


def row_episode(row: dict[str, Any], where: str = "row") -> Episode:
    """The Episode an exported row holds; ConfigError naming `where` and the field if it does not."""
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
        values["rule"] = Rule(**values["rule"]) if values["rule"] is not None else None
        return Episode(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: not an exported episode ({exc})") from None


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a `.parquet` file, a `save_to_disk` folder, or a folder holding grid.parquet."""
    from datasets import Dataset, load_from_disk

    path = Path(path)
    if path.is_dir() and (path / "grid.parquet").exists():
        path = path / "grid.parquet"
    ds = Dataset.from_parquet(str(path)) if path.suffix == ".parquet" else load_from_disk(str(path))
    return ds.to_list()
