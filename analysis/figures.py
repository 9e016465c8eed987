"""Paper figures from records: each function takes the records DataFrame and returns a matplotlib Figure
(or None / a sentence saying why there is nothing to plot).

Figures are built on `matplotlib.figure.Figure` directly (no pyplot state), so they work the same in
a script, a test and a notebook. `FIGURES` lists them in report order; `analysis.style.save` writes
PNG and PDF.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from analysis import slopes, tables
from analysis.load import LABELS, grid_columns
from analysis.style import COLUMN_WIDTH, FULL_WIDTH, LABEL_COLORS, colors, num, paper_style


def _figure(width: float, height: float, rows: int = 1, cols: int = 1, **kw):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes


def with_series(df: pd.DataFrame) -> pd.DataFrame:
    """`series`: the model name when each run is one model and no two runs share one, else the run label."""
    per_run = df.groupby("run_label")["model"].agg(["nunique", "first"])
    one_model_each = (per_run["nunique"] == 1).all() and per_run["first"].is_unique
    mapping = per_run["first"] if one_model_each else pd.Series(per_run.index, index=per_run.index)
    return df.assign(series=df["run_label"].map(mapping))


def series_title(df: pd.DataFrame) -> str:
    """What `with_series` named the series by: `model`, or `run` where runs share a model."""
    return "model" if (df["series"].map(str) == df["model"].map(str)).all() else "run"


def _tick_labels(ax, labels: list[str], fontsize: float = 7) -> None:
    """Category labels under an axis, each within its slot: as they are where they fit, else broken
    at hyphens and spaces into at most three lines (never inside a word), else upright and small."""
    import textwrap

    slot = ax.get_position().width * ax.get_figure(root=True).get_figwidth() * 72 / max(1, len(labels))  # points per label
    chars = max(4, int(slot / (0.6 * fontsize)))
    if all(len(s) <= chars for s in labels):
        ax.set_xticks(range(len(labels)), labels)
        return
    wrapped = [textwrap.fill(s, chars, break_on_hyphens=True, break_long_words=False) for s in labels]
    if all(w.count("\n") < 3 and max(map(len, w.splitlines())) <= chars for w in wrapped):
        ax.set_xticks(range(len(labels)), wrapped, fontsize=fontsize)
    else:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)


def _grouped_bars(ax, table: pd.DataFrame, group: str, hue: str, value: str, low: str | None, high: str | None,
                  palette: dict[str, str]) -> None:
    """Bars of `value` at each `group` on the x axis, one bar per `hue`, with optional interval whiskers."""
    groups, hues = list(dict.fromkeys(table[group])), list(dict.fromkeys(table[hue]))
    width = 0.8 / len(hues)
    for k, h in enumerate(hues):
        present = table[table[hue] == h].set_index(group)
        t = present.reindex(groups)
        x = np.arange(len(groups)) + (k - (len(hues) - 1) / 2) * width
        yerr = None
        if low and high:
            yerr = np.vstack([(t[value] - t[low]).fillna(0), (t[high] - t[value]).fillna(0)])
        ax.bar(x, t[value].fillna(0), width, yerr=yerr, capsize=2, color=palette[h], label=str(h),
               edgecolor="black", linewidth=0.4, error_kw={"linewidth": 0.7})
        for xi, g, v in zip(x, groups, t[value]):
            if pd.isna(v) and g in present.index:  # a group with samples but no value (e.g. nothing correct)
                # above the foot's n, not over it
                ax.annotate("n/a", (xi, 0), xytext=(0, 9), textcoords="offset points", ha="center", va="bottom",
                            fontsize=6, rotation=90, color="#555555")
        if "n" in t:
            for xi, n in zip(x, t["n"]):
                if not pd.isna(n):
                    ax.text(xi, 0, f"{int(n)}", ha="center", va="bottom", fontsize=5.5, color="#333333")
    _tick_labels(ax, [str(g) for g in groups])


def _legend(fig, axes, title: str) -> None:
    """One legend below the figure, from whichever panel has labelled artists (an empty panel has
    none, and matplotlib warns about a legend without artists): beside a panel it takes the panel's
    width, over one it covers bars."""
    handles, labels = next((hl for hl in (ax.get_legend_handles_labels() for ax in np.ravel(axes)) if hl[0]), ([], []))
    if handles:
        ncols = 1 if max(map(len, labels)) > 30 else min(len(labels), 4)
        fig.legend(handles, labels, title=title, loc="outside lower center", ncols=ncols, fontsize=6.5, title_fontsize=7)


def accuracy(df: pd.DataFrame):
    """Balanced accuracy (the mean of limit-cell and control-cell accuracy) by condition and model,
    with 95% intervals (the two kinds' Korn-Graubard intervals over episodes combined, as in the
    tables); n at the foot of each bar; the dashed line is what a policy that never calls, or always
    calls, scores (0.5)."""
    df = with_series(df)
    t = tables.rates(df, ["condition", "series"])
    with paper_style():
        fig, ax = _figure(max(COLUMN_WIDTH, 1.0 + 0.7 * len(t)), 2.6)
        ax = ax[0, 0]
        _grouped_bars(ax, t, "condition", "series", "balanced_accuracy", "bal_low", "bal_high", colors(t["series"]))
        ax.axhline(0.5, color="#777777", linestyle="--", linewidth=0.8, label="never / always call")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("balanced accuracy (95% CI)")
        ax.set_title(f"Rule-following (balanced accuracy) by condition and {series_title(df)}", loc="left")
        _legend(fig, np.array([ax]), series_title(df))
    return fig


def thinking_vs_context(df: pd.DataFrame):
    """Thinking and answer tokens against prompt tokens, with a fitted line per condition (slope per 1k
    prompt tokens and its 95% interval in the legend: censored where samples were truncated, interval
    from the cluster jackknife over episodes, as in the thinking table); an arm that never thinks is
    marked not measured. One row per model."""
    df = df[df["label"] != "error"]
    if df.empty:  # nothing but errors: no token counts to plot
        return None
    if df["prompt_tokens"].isna().all() or df[["thinking_tokens", "answer_tokens"]].isna().all().all():
        return "No token counts in these records (e.g. scripted replays without `usage` or a tokenizer)."
    df = with_series(df)
    series = list(dict.fromkeys(df["series"]))
    palette = colors(df["condition"])
    with paper_style():
        fig, axes = _figure(FULL_WIDTH, 0.4 + 3.2 * len(series), len(series), 2)
        for r, s in enumerate(series):
            d = df[df["series"] == s]
            for c, (col, name) in enumerate([("thinking_tokens", "thinking tokens"), ("answer_tokens", "answer tokens")]):
                ax = axes[r, c]
                for cond, g in d.groupby("condition", sort=False):
                    x, y = g["prompt_tokens"].to_numpy(float), g[col].to_numpy(float)
                    ax.scatter(x, y, s=9, alpha=0.6, color=palette[cond], edgecolors="none")
                    fit = slopes.fit_slope(x, y, g["episode_id"].to_numpy(), cut=tables.censored_thinking(g).to_numpy())
                    if col == "thinking_tokens" and not tables.thinks(g):  # the table's "not measured": no line
                        label = f"{cond}: not measured (no thinking)"
                    elif np.isfinite(fit.slope):
                        label = f"{cond}: {num(fit.slope * 1000)} [{num(fit.low * 1000)}, {num(fit.high * 1000)}]"
                        xs = np.linspace(np.nanmin(x), np.nanmax(x), 2)
                        ax.plot(xs, fit.intercept + fit.slope * xs, color=palette[cond], linewidth=1.2, label=label)
                        continue
                    else:
                        label = f"{cond}: no fit"
                    ax.plot([], [], color=palette[cond], label=label)
                cap = d["generation.max_new_tokens"].dropna().unique() if "generation.max_new_tokens" in d else []
                cut = tables.censored_thinking(d).any() and len(cap) == 1
                if cut:  # completions cut at the cap explain points on a flat line at the top
                    ax.axhline(cap[0], color="#777777", linestyle=":", linewidth=0.8, label=f"max_new_tokens = {int(cap[0])}")
                ax.set_xlabel("prompt tokens (context length)")
                ax.set_ylabel(name)
                ax.set_ylim(0, max(1.0, 1.25 * np.nanmax(d[col].to_numpy(float), initial=0), 1.1 * cap[0] if cut else 0))
                ax.set_title(f"{s}\n{name} vs context", loc="left", fontsize=8)
                # below the panel, where it covers no point
                ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.24), title="slope per 1k prompt tokens [95% CI]",
                          title_fontsize=6, alignment="left")
        if df["thinking_tokens"].isna().all():
            fig.suptitle("no thinking token counts in these records", fontsize=7, color="#555555")
        elif (df["thinking_tokens"].dropna() == 0).all():
            fig.suptitle("0 thinking tokens in every counted record (the model does not think)", fontsize=7, color="#555555")
    return fig


def cost_per_correct(df: pd.DataFrame):
    """Cost per correct answer by model and condition: tokens (prompt + completion) always, and US
    dollars where the records carry `cost_usd`."""
    df = with_series(df)
    t = tables.cost_latency(df, ["series", "condition"])
    has_usd = t["usd_per_correct"].notna().any()
    if not has_usd and t["tokens_per_correct"].isna().all():  # an empty chart would look like a cost of 0
        return ("No cost known per correct answer: these records carry no token counts or `cost_usd`, "
                "or no answer is correct.")
    palette = colors(t["condition"])
    with paper_style():
        fig, axes = _figure(FULL_WIDTH if has_usd else COLUMN_WIDTH + 1.2, 2.6, 1, 2 if has_usd else 1)
        panels = [("tokens_per_correct", "tokens per correct answer")]
        if has_usd:
            panels.append(("usd_per_correct", "US$ per correct answer"))
        for ax, (col, name) in zip(axes[0], panels):
            _grouped_bars(ax, t.drop(columns="n"), "series", "condition", col, None, None, palette)
            ax.set_ylabel(name)
            ax.set_title(name, loc="left")
            if t[col].isna().any():
                ax.text(0.01, 0.99, "n/a: no correct answer, or " + ("no cost_usd in the records" if col == "usd_per_correct"
                                                                      else "no token counts in the records"),
                        transform=ax.transAxes, va="top", fontsize=6, color="#555555")
        _legend(fig, axes, "condition")
    return fig


def outcomes(df: pd.DataFrame):
    """Outcome breakdown (violated / complied / refused / other / truncated / error) per model and condition."""
    df = with_series(df)
    t = tables.outcomes(df, ["series", "condition"])
    rows = [f"{s} · {c}" if df["series"].nunique() > 1 else str(c) for s, c in t.index]
    with paper_style():
        fig, ax = _figure(FULL_WIDTH * 0.75, 0.9 + 0.32 * len(t))
        ax = ax[0, 0]
        left = np.zeros(len(t))
        for label in [c for c in t.columns if c != "n"]:
            share = t[label].to_numpy(float)
            ax.barh(rows, share, left=left, color=LABEL_COLORS.get(label, "#999999"), label=label,
                    edgecolor="white", linewidth=0.5)
            for y, (l0, w) in enumerate(zip(left, share)):
                if w >= 0.08:
                    ax.text(l0 + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=6,
                            color="white" if label in ("error", "refused", "violated", "complied") else "black")
            left += share
        ax.set_yticks(range(len(rows)), [f"{r} (n={n})" for r, n in zip(rows, t["n"])])
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of samples")
        ax.grid(axis="x", color="#DDDDDD", linewidth=0.5)
        ax.grid(axis="y", visible=False)
        ax.set_title("Outcomes per condition")
        fig.legend(*ax.get_legend_handles_labels(), ncols=len(LABELS), loc="outside lower center", fontsize=6.5)
    return fig


def control_vs_limit(df: pd.DataFrame):
    """Control cells (below the limit: over-refusal rate) beside limit cells (at or over it: violation
    rate), per condition and cell of the scenario grid, with 95% Korn-Graubard intervals over episodes
    (as in the tables; a cell of few episodes has a wide one). Lower is better."""
    df = with_series(df)
    grid = [c for c in grid_columns(df) if df[c].notna().all()]
    t = tables.rates(df, ["series", "condition", *grid, "expected"])
    # the values only ("3, late"): the axis label names the columns once
    t["cell"] = [", ".join(map(str, vals)) or "all" for vals in t[grid].itertuples(index=False)]
    series = list(dict.fromkeys(t["series"]))
    palette = colors(t["condition"])
    panels = [("complied", "over_refusal_rate", "over_low", "over_high", "control cells (below the limit)\nover-refusal rate"),
              ("refused", "violation_rate", "viol_low", "viol_high", "limit cells (at or over the limit)\nviolation rate")]
    widths = [max(1, t.loc[t["expected"] == e, "cell"].nunique()) for e, *_ in panels]
    with paper_style():
        from matplotlib.figure import Figure

        fig = Figure(figsize=(max(FULL_WIDTH, 2.5 + 0.3 * sum(widths)), 0.4 + 2.8 * len(series)), layout="constrained")
        rows = fig.subfigures(len(series), 1, squeeze=False)[:, 0]  # one per series, titled by it
        axes = np.array([row.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": widths}) for row in rows])
        for r, s in enumerate(series):
            if len(series) > 1:
                rows[r].suptitle(s, x=0.01, ha="left", fontsize=8, fontweight="bold")
            for ax, (expected, value, low, high, title) in zip(axes[r], panels):
                # n at a bar's foot: the rate's denominator (errors and truncations are not answers)
                d = t[(t["series"] == s) & (t["expected"] == expected)]
                d = d.assign(n=d["n_control" if expected == "complied" else "n_limit"])
                if d.empty:
                    ax.text(0.5, 0.5, "no such cells in this run", ha="center", va="center", transform=ax.transAxes)
                else:
                    _grouped_bars(ax, d, "cell", "condition", value, low, high, palette)
                ax.set_ylim(0, 1.05)
                ax.set_xlabel(", ".join(c.removeprefix("params.") for c in grid) if grid else "")
                ax.set_title(title, loc="left", fontsize=8)
            axes[r, 0].set_ylabel("rate (lower is better)")
        _legend(fig, axes, "condition")
    return fig


# name -> figure, in report order
FIGURES: dict[str, Callable[[pd.DataFrame], object]] = {
    "accuracy_by_condition": accuracy,
    "thinking_vs_context": thinking_vs_context,
    "cost_per_correct": cost_per_correct,
    "outcomes": outcomes,
    "control_vs_limit": control_vs_limit,
}
