"""The few lines a run prints when it ends: where the report is, and what it says in brief."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import tables
from analysis.rollouts import multi_step


def summary_lines(df: pd.DataFrame, out: Path, rollouts: pd.DataFrame | None = None) -> list[str]:
    """Files written, then samples by outcome, then each condition's balanced accuracy; for live
    rollouts, each arm's rollouts, violations per rollout and steps."""
    lines = [f"report: {out / 'report.html'} (and report.md, figures, beside it)"]
    if df.empty:
        return lines + ["no records yet"]
    counts = df["label"].value_counts()
    lines.append(f"{len(df)} samples: " + ", ".join(f"{n} {label}" for label, n in counts.items()))
    by = tables.rates(df, ["condition"])
    lines.append("balanced accuracy: " + "; ".join(
        f"{r.condition} {_num(r.balanced_accuracy)}" for r in by.itertuples()))
    if rollouts is not None and not rollouts.empty and multi_step(df):
        lines += [f"{cond}: {len(g)} rollouts, {g['violations'].mean():.2f} violations per rollout, "
                  f"{(g['violations'] > 0).mean():.0%} with a violation, {g['steps'].mean():.1f} steps each"
                  for cond, g in rollouts.groupby("condition", sort=True)]
    return lines


def _num(x: float) -> str:
    return "–" if pd.isna(x) else f"{x:.2f}"
