"""Attention-probe figures and report section for runs made with `probe.attention=true`.

Shares are attention mass per generated token, averaged over heads, then over samples: a region's
share at a layer is what one generated token of that layer puts on it. A long region gets more
attention for its length alone, so each share stands beside its share per token (share / the
region's length in tokens: the prompt tokens it covers, or for `generated` the completion's tokens),
both averaged over each episode's samples and then over episodes, with intervals over episodes. `template` holds the turn
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

from analysis import stats
from analysis.section import Section, md_text
from analysis.style import FULL_WIDTH, colors, ordered_regions, region_colors, save
from harness.measure.attention import store
from harness.measure.attention.regions import region_group

HEATMAP, SHARES, STRIP = "attention_layers_by_region", "attention_share_by_region", "attention_token_strip"


def region_lengths(a: dict[str, np.ndarray]) -> np.ndarray:
    """Tokens of each region of one probed sample: the prompt tokens it covers; the last region
    (generated) the completion's tokens."""
    lengths = np.bincount(np.asarray(a["token_regions"], dtype=np.int64), minlength=len(a["regions"])).astype(np.float64)
    lengths[-1] = float(np.asarray(a["counts"]).sum())
    return lengths


def group_lengths(a: dict[str, np.ndarray]) -> pd.Series:
    """region_lengths summed per region group (call_record_i -> call_records)."""
    return pd.Series(region_lengths(a), index=[region_group(str(n)) for n in a["regions"]]).groupby(level=0).sum()


def layer_shares(run_dirs: list[Path], df: pd.DataFrame) -> pd.DataFrame:
    """One row per sample, phase (all, thinking, answer), layer and region group: share of the
    attention per generated token, and that share per token of the region (`per_token`)."""
    rows = []
    for run in run_dirs:
        arrays = store.load(run)
        meta = df[df["run"] == str(run)].set_index("sample_id")
        for sid, a in arrays.items():
            if sid not in meta.index:
                continue
            groups = [region_group(str(n)) for n in a["regions"]]
            lengths = group_lengths(a)
            masses = a["masses"].astype(np.float64).mean(axis=2)  # [phase, layer, region]: heads averaged
            phases = {"thinking": (masses[0], a["counts"][0]), "answer": (masses[1], a["counts"][1]),
                      "all": (masses.sum(0), a["counts"].sum())}
            for phase, (m, n) in phases.items():
                if n == 0:
                    continue
                share = pd.DataFrame(m / n, columns=groups).T.groupby(level=0).sum().T  # merge call_record_i
                long = share.rename_axis("layer").reset_index().melt(id_vars="layer", var_name="region", value_name="share")
                per_token = long["share"] / long["region"].map(lengths).replace(0, np.nan)  # an empty region has none
                rows.append(long.assign(per_token=per_token, sample_id=sid, run=str(run), condition=meta.at[sid, "condition"],
                                        episode_id=meta.at[sid, "episode_id"], phase=phase))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _mean_table(shares: pd.DataFrame) -> pd.DataFrame:
    """condition x region share over all layers (samples missing a region count it as 0)."""
    per_sample = shares.pivot_table(index=["condition", "sample_id"], columns="region", values="share",
                                    aggfunc="mean", fill_value=0.0)
    return per_sample.groupby(level="condition", sort=False).mean()[ordered_regions(per_sample.columns)]


def episode_table(shares: pd.DataFrame) -> pd.DataFrame:
    """Per condition and region: mean share and share per token over all layers, averaged over each
    episode's samples, then over episodes with intervals (analysis.stats.mean_interval)."""
    per_sample = shares.groupby(["condition", "episode_id", "sample_id", "region"], sort=False)[["share", "per_token"]].mean()
    wide = {"share": per_sample["share"].unstack("region", fill_value=0.0),  # a region a sample lacks draws nothing
            "per_token": per_sample["per_token"].unstack("region")}  # ... and has no length to divide by
    by_episode = {m: w.groupby(level=["condition", "episode_id"], sort=False).mean() for m, w in wide.items()}
    rows = []
    for condition in dict.fromkeys(shares["condition"]):
        for region in ordered_regions(wide["share"].columns):
            row = {"condition": condition, "region": region}
            for metric, w in by_episode.items():
                e = stats.mean_interval(w.loc[condition, region].to_numpy(), within=(0.0, 1.0))
                row |= {metric: e.est, f"{metric}_low": e.low, f"{metric}_high": e.high, f"{metric}_episodes": e.episodes}
            rows.append(row)
    return pd.DataFrame(rows)


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
    """Share per region and share per token of the region, per condition, with 95% intervals over episodes."""
    from matplotlib.figure import Figure

    conditions = list(dict.fromkeys(table["condition"]))
    regions = list(dict.fromkeys(table["region"]))
    fig = Figure(figsize=(FULL_WIDTH, 4.6), layout="constrained")
    axes = fig.subplots(2, 1)
    width = 0.8 / len(conditions)
    palette = colors(conditions)
    for ax, metric, label in ((axes[0], "share", "share of attention\nper generated token"),
                              (axes[1], "per_token", "share per token\nof the region")):
        for k, condition in enumerate(conditions):
            t = table[table["condition"] == condition].set_index("region").reindex(regions)
            x = np.arange(len(regions)) + (k - (len(conditions) - 1) / 2) * width
            err = np.vstack([(t[metric] - t[f"{metric}_low"]).fillna(0), (t[f"{metric}_high"] - t[metric]).fillna(0)])
            ax.bar(x, t[metric].fillna(0), width, yerr=err, capsize=2, label=condition, color=palette[condition],
                   edgecolor="black", linewidth=0.4, error_kw={"linewidth": 0.7})
        ax.set_xticks(range(len(regions)), regions, rotation=30, ha="right")
        ax.set_ylabel(label)
    axes[1].set_yscale("log")  # one-token regions (sinks) and long ones differ by orders of magnitude
    axes[0].set_title("Where generated tokens look (mean over layers and heads, samples, then episodes; 95% CI over episodes)")
    axes[0].legend()
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


def _ci(est: float, low: float, high: float, fmt: str) -> str:
    f = lambda x: "–" if pd.isna(x) else format(x, fmt)  # noqa: E731
    return f"{f(est)} [{f(low)}, {f(high)}]"


def _share_table(t: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"condition": t["condition"], "region": t["region"], "episodes": t["share_episodes"].astype(int),
                         "share [95% CI]": [_ci(*r, ".3f") for r in zip(t["share"], t["share_low"], t["share_high"])],
                         "share per token [95% CI]": [_ci(*r, ".3g") for r in zip(t["per_token"], t["per_token_low"],
                                                                                    t["per_token_high"])]})


def _headline(t: pd.DataFrame) -> str:
    """The seed's picture in numbers: the bar's share (and per token) in each arm that has one
    against the call records' in the arm without."""
    at = t.set_index(["condition", "region"])

    def said(condition: str, region: str) -> str:
        r = at.loc[(condition, region)]
        return (f"{_ci(r['share'], r['share_low'], r['share_high'], '.3f')} of the attention per generated token "
                f"({_ci(r['per_token'], r['per_token_low'], r['per_token_high'], '.3g')} per token of it, "
                f"{int(r['share_episodes'])} episodes)")

    lines = []
    conditions = list(dict.fromkeys(t["condition"]))
    baseline = "none" if "none" in conditions else None
    for condition in conditions:
        if (condition, "status") in at.index and at.loc[(condition, "status"), "share"] > 0:
            line = f"In `{condition}` the status bar gets {said(condition, 'status')}"
            if (condition, "call_records") in at.index:
                line += f"; the call records {said(condition, 'call_records')}"
            if baseline and (baseline, "call_records") in at.index:
                line += f"; in `{baseline}` the call records get {said(baseline, 'call_records')}"
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
    by_episode = episode_table(everything)
    save(heatmap_figure(everything, conditions), out_dir, HEATMAP)
    save(shares_figure(by_episode), out_dir, SHARES)
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
            f"({weights.get('revision') or 'no revision'}, {weights.get('dtype')}). {_headline(by_episode)} Shares are per "
            "generated token, averaged over heads and layers, over each episode's samples, then over episodes; share per "
            "token = share / the region's length in tokens (a long region draws attention for its length alone); 95% "
            f"{stats.MEAN_NOTE} [0, 1]; – where every episode shows the same share. `template` is turn markers and the "
            "first token (attention sinks), `generated` the completion's own tokens.")
    fmt = lambda t: t.reset_index().rename(columns={"index": "condition"}).round(3)  # noqa: E731
    return [Section("Attention: share per region", text, _share_table(by_episode), SHARES),
            Section("Attention: thinking vs answer tokens", "", fmt(by_phase)),
            Section("Attention: layers x regions", "Per condition, and each condition minus the first.", None, HEATMAP),
            Section("Attention: token strip", f"One episode per condition ({md_text(episode)}).", None, STRIP)]

