"""The few lines a run prints when it ends: where the report is, and what it says in brief."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import tables


def summary_lines(df: pd.DataFrame, out: Path) -> list[str]:
    """Files written, then samples by outcome, then each condition's balanced accuracy."""
    lines = [f"report: {out / 'report.html'} (and report.md, figures, beside it)"]
    if df.empty:
        return lines + ["no records yet"]
    counts = df["label"].value_counts()
    lines.append(f"{len(df)} samples: " + ", ".join(f"{n} {label}" for label, n in counts.items()))
    by = tables.rates(df, ["condition"])
    lines.append("balanced accuracy: " + "; ".join(
        f"{r.condition} {_num(r.balanced_accuracy)}" for r in by.itertuples()))
    return lines


def _num(x: float) -> str:
    return "–" if pd.isna(x) else f"{x:.2f}"
