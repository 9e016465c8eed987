"""Records of one or many run directories as one pandas DataFrame."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.store import read_jsonl


def load_records(run_dirs: list[Path | str]) -> pd.DataFrame:
    frames = []
    for d in map(Path, run_dirs):
        path = d / "records.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"{d} has no records.jsonl: is it a statusbench run directory?")
        rows = read_jsonl(path)
        if rows:
            df = pd.json_normalize(rows, max_level=1)
            df["run"] = str(d)
            frames.append(df)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def grid_columns(df: pd.DataFrame) -> list[str]:
    """Scenario parameters that vary across the records (the cells of the grid), minus the index."""
    cols = [c for c in df.columns if c.startswith("params.") and c != "params.index"]
    return [c for c in cols if df[c].astype(str).nunique() > 1]
