"""Attention-probe figures and report section for runs made with `probe.attention=true`.

Shares are attention mass per generated token, averaged over heads, then over samples: a region's
share at a layer is what one generated token of that layer puts on it. `template` holds the turn
markers and the first token, where attention sinks sit; `generated` is the completion's own tokens.
Figures: a layers x regions heatmap per condition and each condition's difference from the first;
the mean share per region (all layers) in one bar chart; a token-level strip over one prompt per
condition at the probe's strip layer.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.section import Section, md_text
from analysis.style import FULL_WIDTH, colors, ordered_regions, region_colors, save
from harness.measure.attention import store
from harness.measure.attention.regions import region_group

HEATMAP, SHARES, STRIP = "attention_layers_by_region", "attention_share_by_region", "attention_token_strip"


def layer_shares(run_dirs: list[Path], df: pd.DataFrame) -> pd.DataFrame:
    """One row per sample, phase (all, thinking, answer), layer and region group: share per token."""
    rows = []
    for run in run_dirs:
        arrays = store.load(run)
        meta = df[df["run"] == str(run)].set_index("sample_id")
        for sid, a in arrays.items():
            if sid not in meta.index:
                continue
            groups = [region_group(str(n)) for n in a["regions"]]
            masses = a["masses"].astype(np.float64).mean(axis=2)  # [phase, layer, region]: heads averaged
            phases = {"thinking": (masses[0], a["counts"][0]), "answer": (masses[1], a["counts"][1]),
                      "all": (masses.sum(0), a["counts"].sum())}
            for phase, (m, n) in phases.items():
                if n == 0:
                    continue
                share = pd.DataFrame(m / n, columns=groups).T.groupby(level=0).sum().T  # merge call_record_i
                long = share.rename_axis("layer").reset_index().melt(id_vars="layer", var_name="region", value_name="share")
                rows.append(long.assign(sample_id=sid, run=str(run), condition=meta.at[sid, "condition"], phase=phase))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _mean_table(shares: pd.DataFrame) -> pd.DataFrame:
    """condition x region share over all layers (samples missing a region count it as 0)."""
    per_sample = shares.pivot_table(index=["condition", "sample_id"], columns="region", values="share",
                                    aggfunc="mean", fill_value=0.0)
    return per_sample.groupby(level="condition", sort=False).mean()[ordered_regions(per_sample.columns)]


def heatmap_figure(shares: pd.DataFrame, conditions: list[str]):
    from matplotlib.figure import Figure

    regions = ordered_regions(shares["region"].unique())
    grids = {c: shares[shares["condition"] == c].pivot_table(index="layer", columns="region", values="share",
                                                              aggfunc="mean", fill_value=0.0).reindex(columns=regions, fill_value=0.0)
             for c in conditions}
    panels = [(c, grids[c], "viridis") for c in conditions]
    panels += [(f"{c} - {conditions[0]}", grids[c] - grids[conditions[0]], "RdBu_r") for c in conditions[1:]]
    fig = Figure(figsize=(FULL_WIDTH * max(1.0, len(panels) / 3), 0.09 * len(grids[conditions[0]]) + 2.2), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    vmax = max(g.to_numpy().max() for g in grids.values())
    for ax, (title, grid, cmap) in zip(axes, panels):
        diff = cmap == "RdBu_r"
        lim = np.abs(grid.to_numpy()).max() or 1.0
        im = ax.imshow(grid.to_numpy(), aspect="auto", cmap=cmap, origin="lower",
                       vmin=-lim if diff else 0, vmax=lim if diff else vmax, interpolation="nearest")
        ax.set_title(title)
        ax.set_xticks(range(len(regions)), regions, rotation=90)
        ax.set_ylabel("layer")
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.8, label="difference" if diff else "share per token")
    return fig


def shares_figure(table: pd.DataFrame):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(FULL_WIDTH, 2.6), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(table)
    palette = colors(table.index)
    for k, (condition, row) in enumerate(table.iterrows()):
        x = np.arange(len(row)) + (k - (len(table) - 1) / 2) * width
        ax.bar(x, row.to_numpy(), width, label=condition, color=palette[condition], edgecolor="black", linewidth=0.4)
    ax.set_xticks(range(len(table.columns)), table.columns, rotation=30, ha="right")
    ax.set_ylabel("share of attention per generated token")
    ax.set_title("Where generated tokens look (mean over samples, layers and heads)")
    ax.legend()
    return fig


def strip_figure(examples: list[tuple[str, dict[str, np.ndarray]]]):
    """Attention per prompt token at the strip layer, with a band of the tokens' regions below."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    names = ordered_regions({region_group(str(a["regions"][r])) for _, a in examples for r in np.unique(a["token_regions"])})
    palette = region_colors(names)
    fig = Figure(figsize=(FULL_WIDTH, 0.9 * len(examples) + 0.8), layout="constrained")
    axes = fig.subplots(2 * len(examples), 1, squeeze=False, gridspec_kw={"height_ratios": [3, 1] * len(examples)})[:, 0]
    for i, (condition, a) in enumerate(examples):
        ax, band = axes[2 * i], axes[2 * i + 1]
        ax.bar(np.arange(len(a["strip"])), a["strip"], width=1.0, color="#333333")
        ax.set_yscale("log")  # the first token and turn markers (attention sinks) dwarf the rest
        ax.set_xlim(-0.5, len(a["strip"]) - 0.5)
        ax.set_ylabel("attention (log)", rotation=0, ha="right")
        ax.set_title(f"{condition}: layer {int(a['strip_layer'])}, mean over heads and generated tokens", loc="left")
        ax.set_xticks([])
        groups = np.array([names.index(region_group(str(a["regions"][r]))) for r in a["token_regions"]])
        band.imshow(groups[None, :], aspect="auto", cmap=ListedColormap([palette[n] for n in names]),
                    vmin=-0.5, vmax=len(names) - 0.5, interpolation="nearest")
        band.set_yticks([])
        band.grid(False)
        band.set_xlabel("prompt token" if i == len(examples) - 1 else "")
    fig.legend(handles=[Patch(color=palette[n], label=n) for n in names], loc="outside lower center",
               ncol=min(len(names), 6), fontsize=6)
    return fig


def _headline(table: pd.DataFrame) -> str:
    """The seed's picture in numbers: the bar's share in each arm that has one against the call
    records' share in the arm without."""
    lines = []
    baseline = "none" if "none" in table.index else None
    for condition, row in table.iterrows():
        if row.get("status", 0) > 0:
            line = f"In `{condition}` the status bar gets {row['status']:.3f} of the attention per generated token"
            if "call_records" in row:
                line += f" (call records: {row['call_records']:.3f})"
            if baseline and "call_records" in table.columns:
                line += f"; in `{baseline}` the call records get {table.at[baseline, 'call_records']:.3f}"
            lines.append(line + ".")
    return " ".join(lines)


def sections(df: pd.DataFrame, run_dirs: list[Path], out_dir: Path) -> list:
    """The report's attention section (analysis.report's hook); nothing when no run has a probe."""
    run_dirs = [Path(d) for d in run_dirs]
    shares = layer_shares(run_dirs, df)
    if shares.empty:
        return []
    everything = shares[shares["phase"] == "all"]
    conditions = list(dict.fromkeys(df.loc[df["sample_id"].isin(everything["sample_id"]), "condition"]))
    table = _mean_table(everything).reindex(conditions)
    save(heatmap_figure(everything, conditions), out_dir, HEATMAP)
    save(shares_figure(table), out_dir, SHARES)
    archives = {str(d): store.load(d) for d in run_dirs}
    examples, episode = [], None
    for condition in conditions:  # the same episode in every arm when there is one
        rows = df[(df["condition"] == condition) & df["sample_id"].isin(everything["sample_id"])]
        pick = rows[rows["episode_id"] == episode] if episode is not None and (rows["episode_id"] == episode).any() else rows
        first = pick.iloc[0]
        episode = first["episode_id"]
        examples.append((condition, archives[str(first["run"])][first["sample_id"]]))
    save(strip_figure(examples), out_dir, STRIP)
    meta = json.loads(str(next(iter(next(a for a in archives.values() if a).values()))["meta"]))
    weights = meta["replayed_with"]
    by_phase = _mean_table(shares[shares["phase"] != "all"].assign(
        condition=lambda d: d["condition"] + " / " + d["phase"]))
    text = (f"Generated by the `{meta['generated_by']}` backend, replayed teacher-forced with `{weights.get('path')}` "
            f"({weights.get('revision') or 'no revision'}, {weights.get('dtype')}). {_headline(table)} Shares are per generated token, averaged over heads, layers and "
            "samples; `template` is turn markers and the first token (attention sinks), `generated` the "
            "completion's own tokens.")
    fmt = lambda t: t.reset_index().rename(columns={"index": "condition"}).round(3)  # noqa: E731
    return [Section("Attention: share per region", text, fmt(table), SHARES),
            Section("Attention: thinking vs answer tokens", "", fmt(by_phase)),
            Section("Attention: layers x regions", "Per condition, and each condition minus the first.", None, HEATMAP),
            Section("Attention: token strip", f"One episode per condition ({md_text(episode)}).", None, STRIP)]

