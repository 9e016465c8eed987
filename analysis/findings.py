"""The report's finding in words, at its top: which arm moved rule-following, in which cells, and how
sure the data are, from the same paired comparisons as the report's tables (tables.comparisons).

One paragraph per run: each condition against the baseline on balanced accuracy (the headline),
then limit cells and control cells, each with its difference, 95% interval and sign-flip p, and a
word for the evidence that the p-value and the interval both carry. Truncated samples and scripted
completions are said, since both change what the numbers mean.
"""
from __future__ import annotations

import pandas as pd

from analysis import tables
from analysis.section import Section, md_text

ALPHA = 0.05
KIND = {"balanced": "balanced accuracy (limit and control cells weighing the same)", "limit": "limit cells",
        "control": "control cells"}


def evidence(p: float, low: float, high: float) -> str:
    """How sure, in words the sign-flip p earns (an exact test of no effect), and a note where the
    interval says otherwise: it assumes only the values' range, so it is the wider of the two."""
    holds_zero = not (low > 0 or high < 0)
    if p >= ALPHA:
        return "no evidence of a difference" + ("" if holds_zero else " (though the interval excludes 0: borderline)")
    words = "strong evidence" if p < 0.001 else "clear evidence" if p < 0.01 else "evidence"
    return f"{words} of a difference" + (" (its interval, wider, still reaches 0)" if holds_zero else "")


def _said(r: pd.Series) -> str:
    """One comparison in words: the accuracies, the difference with its interval and p, the evidence."""
    cond, base = md_text(r["condition"]), md_text(r["baseline"])
    it = "it" if r["cells"] == "balanced" else "accuracy"
    if r["diff"] == 0:
        moved = f"{cond} leaves {it} at {r['acc_b']:.2f} ({base} {r['acc_a']:.2f})"
    else:
        moved = f"{cond} {'raises' if r['diff'] > 0 else 'lowers'} {it} to {r['acc_b']:.2f} from {r['acc_a']:.2f} ({base})"
    interval = "no interval from one episode" if pd.isna(r["diff_low"]) else f"[{r['diff_low']:+.2f}, {r['diff_high']:+.2f}]"
    return (f"{KIND.get(r['cells'], r['cells'])}, {moved}: difference {r['diff']:+.2f} {interval}, sign-flip p = "
            f"{r['p_two_sided']:.2g} over {int(r['episodes'])} episodes, {evidence(r['p_two_sided'], r['diff_low'], r['diff_high'])}")


def paragraph(comp: pd.DataFrame, df: pd.DataFrame) -> str:
    """The finding for one run's comparisons (rows of tables.comparisons) and records."""
    lines = []
    for cond, rows in comp.groupby("condition", sort=False):
        shown = rows[rows["cells"].isin(list(KIND))].sort_values("cells", key=lambda c: c.map(list(KIND).index))
        if shown.empty:
            continue
        head, *rest = [_said(r) for _, r in shown.iterrows()]
        lines.append(f"On {head}." + (" In " + "; in ".join(rest) + "." if rest else ""))
    truncated = int((df["label"] == "truncated").sum())
    if truncated:
        lines.append(f"{truncated} of {len(df)} samples were cut at the token limit (`truncated`): they count as wrong, so an arm "
                     "cut more often looks worse for that alone (see Warnings).")
    if df["scripted"].any():
        lines.append("These records are scripted (replayed), so they check the pipeline, not a model.")
    return " ".join(lines)


def sections(df: pd.DataFrame) -> list[Section]:
    """The report's opening section: the finding per run, or nothing when no condition can be paired
    with the baseline (a single arm; the tables say why)."""
    try:
        comp = tables.comparisons(df)
    except ValueError:  # the arms cannot be paired: the comparison section says why
        return []
    if comp.empty:
        return []
    several = df["run_label"].nunique() > 1
    runs = comp["run_label"].unique() if several else [None]
    text = [((f"**{md_text(run)}.** " if several else "")
             + paragraph(comp[comp["run_label"] == run] if several else comp, df[df["run_label"] == run] if several else df))
            for run in runs]
    text.append(f"p-values are per comparison, uncorrected; {ALPHA:g} is the line drawn for the words.")
    return [Section("Finding", "\n\n".join(text))]
