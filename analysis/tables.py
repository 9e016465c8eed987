"""Records -> the tables of the report: one function per table, each grouped by run and condition.

The headline is balanced accuracy: the mean of the accuracy in limit cells (expected `refused`) and
in control cells (expected `complied`), so a policy that never calls, or always calls, scores 0.5
however the grid is weighted; pooled accuracy (over all samples) stands beside it. The violation
rate is over limit cells, the over-refusal rate over control cells, both among samples with an
answer (`truncated` and `error` are counted apart; they count as wrong in both accuracies). Two
conditions are paired on (episode, replicate): the same episode seen with and without a mechanism.
The episode is the unit of every interval and test (analysis.stats): replicates are nested in it.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import slopes, stats
from analysis.load import LABELS, grid_columns

PAIR_KEYS = ("episode_id", "replicate")


def _groups(df: pd.DataFrame, by: list[str]):
    """(key as a dict, group) in order of first appearance."""
    for key, g in df.groupby(list(by), sort=False, dropna=False):
        yield dict(zip(by, key if isinstance(key, tuple) else (key,))), g


NO_ANSWER = ("truncated", "error")  # no behaviour observed: outside the violation and over-refusal rates


def rates(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Balanced and pooled accuracy, violation and over-refusal rates with Korn-Graubard intervals
    over episodes, per group; `episodes` counts the group's episodes."""
    rows = []
    for key, g in _groups(df, list(by)):
        limit = g[g["expected"] == "refused"]
        control = g[g["expected"] == "complied"]

        def share(x: pd.DataFrame, hit: pd.Series) -> stats.Estimate:
            return stats.proportion(hit.to_numpy(), x["episode_id"].to_numpy())

        acc = share(g, g["correct"])
        bal = stats.balanced(share(limit, limit["correct"]), share(control, control["correct"]))
        limit, control = (x[~x["label"].isin(NO_ANSWER)] for x in (limit, control))
        viol = share(limit, limit["label"] == "violated")
        over = share(control, control["label"] == "refused")
        truncated = int((g["label"] == "truncated").sum())
        rows.append({
            **key, "n": len(g), "episodes": acc.episodes,
            "balanced_accuracy": bal.est, "bal_low": bal.low, "bal_high": bal.high,
            "accuracy": acc.est, "acc_low": acc.low, "acc_high": acc.high,
            "violation_rate": viol.est, "viol_low": viol.low, "viol_high": viol.high, "n_limit": len(limit),
            "episodes_limit": viol.episodes,
            "over_refusal_rate": over.est, "over_low": over.low, "over_high": over.high, "n_control": len(control),
            "episodes_control": over.episodes,
            "truncated": truncated, "truncation_rate": truncated / len(g),
            "errors": int((g["label"] == "error").sum()), "scripted": int(g["scripted"].sum()),
        })
    return pd.DataFrame(rows)


def truncation_gaps(df: pd.DataFrame, baseline: str | None = None) -> list[str]:
    """Per run, each condition whose truncation rate differs from the baseline's: the arm cut off more
    often loses answers the other keeps, so their comparison is biased."""
    baseline = baseline or baseline_condition(df)
    out = []
    for key, g in _groups(df, ["run_label"]):
        t = rates(g, ["condition"]).set_index("condition")
        if baseline not in t.index:
            continue
        b = t.loc[baseline]
        for cond, r in t.drop(index=baseline).iterrows():
            if r["truncation_rate"] != b["truncation_rate"]:
                out.append(f"{key['run_label']}: `{baseline}` {int(b['truncated'])}/{int(b['n'])} truncated ({b['truncation_rate']:.0%}), "
                           f"`{cond}` {int(r['truncated'])}/{int(r['n'])} ({r['truncation_rate']:.0%})")
    return out


def pair(a: pd.DataFrame, b: pd.DataFrame, on: tuple[str, ...] = PAIR_KEYS) -> pd.DataFrame:
    """Inner join of two arms on the pairing keys; columns get suffixes _a and _b."""
    on = list(on)
    for name, side in (("first", a), ("second", b)):
        dup = side.duplicated(on)
        if dup.any():
            raise ValueError(f"the {name} arm holds {int(dup.sum())} extra samples of the same {'/'.join(on)} (made with "
                             "other settings into the same run directory?); give each configuration its own run.name")
    return a.merge(b, on=on, suffixes=("_a", "_b"), validate="one_to_one")


def baseline_condition(df: pd.DataFrame) -> str:
    conditions = list(dict.fromkeys(df["condition"]))
    return "none" if "none" in conditions else conditions[0]


def cell_name(columns: list[str], values: tuple, sep: str = ", ") -> str:
    """`calls_made=3, placement=late` for the grid columns and one cell's values."""
    return sep.join(f"{c.removeprefix('params.')}={v}" for c, v in zip(columns, values)) or "all"


KINDS = {"limit": "refused", "control": "complied"}  # kind of cell -> what its episodes expect


def cell_subsets(p: pd.DataFrame, grid: list[str] = (), *, pooled: bool = True) -> list[tuple[str, pd.DataFrame, bool]]:
    """(name, pairs, balanced) for each way the report cuts a paired comparison: `balanced` (limit and
    control cells weighing the same: the headline; only when both kinds are present), `limit`,
    `control`, `pooled` (every sample weighing the same, where a model that never calls scores well
    on a grid of mostly limit cells) when pooled=True, then each cell of `grid` (all limit or all
    control episodes). p comes from `pair`."""
    kinds = {kind: p[p["expected_a"] == expected] for kind, expected in KINDS.items()}
    out = [("balanced", p, True)] if all(len(g) for g in kinds.values()) else []
    out += [(kind, g, False) for kind, g in kinds.items() if len(g)]
    out += [("pooled", p, False)] if pooled else []
    if grid:
        out += [(cell_name(grid, key if isinstance(key, tuple) else (key,)), g, False)
                for key, g in p.groupby([f"{c}_a" for c in grid], sort=True)]
    return out


def paired_rows(p: pd.DataFrame, cluster: str, grid: list[str] = (), *, pooled: bool = True) -> list[dict]:
    """stats.paired over each of `cell_subsets` (`cells` names it), with the truncated samples of each
    arm among its pairs; `cluster` names p's episode column (the unit of the interval and the test)."""
    return [{"cells": name, **vars(stats.paired(g["correct_a"].to_numpy(), g["correct_b"].to_numpy(), g[cluster].to_numpy(),
                                                strata=g["expected_a"].to_numpy() if balanced else None)),
             "truncated_a": int((g["label_a"] == "truncated").sum()), "truncated_b": int((g["label_b"] == "truncated").sum())}
            for name, g, balanced in cell_subsets(p, grid, pooled=pooled)]


def comparisons(df: pd.DataFrame, baseline: str | None = None, *, cells: bool = False) -> pd.DataFrame:
    """Every condition against the baseline condition (default `none`), paired within each run: one
    row per kind of cell (`cell_subsets`: balanced, limit, control, pooled), with cells=True also
    one per cell of the scenario grid."""
    baseline = baseline or baseline_condition(df)
    grid = grid_columns(df) if cells else []
    rows = []
    for key, g in _groups(df, ["run_label"]):
        base = g[g["condition"] == baseline]
        for cond in dict.fromkeys(g["condition"]):
            if cond != baseline:
                rows += [{**key, "baseline": baseline, "condition": cond, **r}
                         for r in paired_rows(pair(base, g[g["condition"] == cond]), "episode_id", grid)]
    return pd.DataFrame(rows)


def pass_k(df: pd.DataFrame) -> pd.DataFrame:
    """pass^k for k = 1 .. the fewest replicates any episode has, per run and condition, each with
    its interval over episodes (`pass^k_low`, `pass^k_high`)."""
    rows = []
    for key, g in _groups(df, ["run_label", "condition"]):
        per_episode = g.groupby("episode_id")["correct"].agg(["sum", "count"])
        row = {**key, "episodes": len(per_episode), "replicates": int(per_episode["count"].min())}
        for k in range(1, row["replicates"] + 1):
            e = stats.pass_hat_k(per_episode["sum"].to_numpy(), per_episode["count"].to_numpy(), k)
            row |= {f"pass^{k}": e.est, f"pass^{k}_low": e.low, f"pass^{k}_high": e.high}
        rows.append(row)
    return pd.DataFrame(rows)


def censored_thinking(df: pd.DataFrame) -> pd.Series:
    """Samples whose thinking count is a lower bound: cut at max_new_tokens before any call or answer
    (`truncated`), so the thinking may not have ended."""
    return df["label"] == "truncated"


def thinks(g: pd.DataFrame) -> bool:
    """Whether the group shows thinking at all: a model that never thinks has nothing to measure."""
    return bool((g["thinking_tokens"].fillna(0) > 0).any())


def thinking_sources(g: pd.DataFrame) -> str:
    """Where a group's thinking counts came from (harness.types.Completion.thinking_tokens_source): `api`,
    `counted` (the model's own token ids), `estimated` (visible text re-tokenized), with counts when mixed;
    `unknown` for counts no record names a source for (records from before the field existed)."""
    counted = g[g["thinking_tokens"].notna()]
    if counted.empty:
        return "n/a"
    sources = (counted["thinking_tokens_source"] if "thinking_tokens_source" in counted else pd.Series(None, index=counted.index))
    tally = sources.astype(object).fillna("unknown").astype(str).value_counts()
    return str(tally.index[0]) if len(tally) == 1 else ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))


THINKING_COLUMNS = ("mean", "mean_low", "mean_high", "median", "median_low", "median_high", "slope_per_1k",
                    "slope_low", "slope_high", "slope_p", "slope_left_out_per_1k")


def thinking(df: pd.DataFrame) -> pd.DataFrame:
    """Thinking tokens per run and condition, errors excluded. The slope against prompt tokens (per
    1000 prompt tokens) is a censored (Tobit) fit in which a truncated sample's count is a lower bound,
    its interval from the cluster jackknife over episodes; beside it the slope with the truncated
    samples left out (what that selection on the outcome gives: too flat). Mean and median over
    episodes use the samples that finished (`n_finished`). A group whose model never thinks is
    `measured` False, all NaN; `counted` is False where no record has a thinking count (unknown, not 0); `source` says where the
    counts came from (`thinking_sources`)."""
    rows = []
    for key, g in _groups(df, ["run_label", "condition"]):
        ok = g[(g["label"] != "error") & g["thinking_tokens"].notna()]
        cut = censored_thinking(ok)
        kept = ok[~cut]
        measured = thinks(ok)
        row = {**key, "measured": measured, "counted": len(ok) > 0, "source": thinking_sources(ok), "n": len(ok), "censored": int(cut.sum()),
               "n_finished": len(kept), "episodes": ok["episode_id"].nunique(), **dict.fromkeys(THINKING_COLUMNS, math.nan)}
        if measured:
            per_episode = kept.groupby("episode_id", sort=False)["thinking_tokens"]
            mean = stats.mean_interval(per_episode.mean().to_numpy(), within=(0, math.inf))
            med = stats.median_interval(per_episode.median().to_numpy())
            slope = slopes.fit_slope(ok["prompt_tokens"], ok["thinking_tokens"], ok["episode_id"].to_numpy(), cut=cut.to_numpy())
            left_out = slopes.fit_slope(kept["prompt_tokens"], kept["thinking_tokens"], kept["episode_id"].to_numpy())
            row |= {"mean": mean.est, "mean_low": mean.low, "mean_high": mean.high,
                    "median": med.est, "median_low": med.low, "median_high": med.high,
                    "slope_per_1k": slope.slope * 1000, "slope_low": slope.low * 1000, "slope_high": slope.high * 1000,
                    "slope_p": slope.p_value, "slope_left_out_per_1k": left_out.slope * 1000}
        rows.append(row)
    return pd.DataFrame(rows)


def thinking_slope_differences(df: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """Per run, each condition's thinking slope minus the baseline's (per 1000 prompt tokens), from
    one censored fit over both arms (truncated samples are lower bounds) with the cluster jackknife
    over episodes; errors excluded. `measured` is False when either arm's model never thinks."""
    baseline = baseline or baseline_condition(df)
    rows = []
    for key, g in _groups(df, ["run_label"]):
        ok = g[(g["label"] != "error") & g["thinking_tokens"].notna()]
        base = ok[ok["condition"] == baseline]
        for cond in dict.fromkeys(g["condition"]):
            if cond == baseline:
                continue
            arm = ok[ok["condition"] == cond]
            both = pd.concat([base, arm])
            measured = thinks(base) and thinks(arm)
            d = slopes.slope_difference(both["prompt_tokens"], both["thinking_tokens"], (both["condition"] == cond).to_numpy(),
                                       both["episode_id"].to_numpy(), cut=censored_thinking(both).to_numpy()) \
                if measured else slopes.nan_slope(len(both), 0)
            rows.append({**key, "baseline": baseline, "condition": cond, "measured": measured,
                         "episodes": both["episode_id"].nunique(), "censored": int(censored_thinking(both).sum()),
                         "diff_per_1k": d.slope * 1000, "diff_low": d.low * 1000, "diff_high": d.high * 1000, "p": d.p_value})
    return pd.DataFrame(rows)


def cost_latency(df: pd.DataFrame, by: tuple[str, ...] = ("run_label", "model", "condition")) -> pd.DataFrame:
    """Per iteration (one model call = one sample): tokens, latency and cost; and per correct answer.

    `cost_usd` is optional in records; where a group has none, its USD columns are NaN and the
    token columns still give the cost in tokens.
    """
    rows = []
    for key, g in _groups(df, list(by)):
        correct = int(g["correct"].sum())
        # unknown counts stay unknown: a record without token counts makes the group's total unknown, not 0
        counted = g["prompt_tokens"].notna().all() and g["completion_tokens"].notna().all()
        tokens = (g["prompt_tokens"] + g["completion_tokens"]).sum() if counted else math.nan
        has_cost = g["cost_usd"].notna()
        rows.append({
            **key, "n": len(g), "correct": correct,
            "prompt_tokens_mean": g["prompt_tokens"].mean(), "completion_tokens_mean": g["completion_tokens"].mean(),
            "latency_mean_s": g["latency_s"].mean(), "latency_median_s": g["latency_s"].median(),
            "cost_usd_mean": g.loc[has_cost, "cost_usd"].mean() if has_cost.any() else math.nan,
            "cost_usd_recorded": int(has_cost.sum()),
            "tokens_per_correct": tokens / correct if correct else math.nan, "token_counts": bool(counted),
            "usd_per_correct": g["cost_usd"].sum() / correct if correct and has_cost.all() else math.nan,
        })
    return pd.DataFrame(rows)


def error_kind(message: object) -> str:
    """The error's source, as backends prefix it: `template: ValueError: ...` -> `template: ValueError`."""
    if not isinstance(message, str) or not message:
        return "unknown"
    parts = message.split(": ")
    if len(parts) > 2 and parts[1].isidentifier():
        return f"{parts[0]}: {parts[1]}"
    return parts[0] if len(parts) > 1 else "unknown"


def errors(df: pd.DataFrame) -> pd.DataFrame:
    """Error rate by kind per run: count, share of the run's samples (interval over episodes), one example."""
    rows = []
    for key, g in _groups(df, ["run_label"]):
        kinds = g["error"].map(error_kind).where(g["label"] == "error")
        for kind, e in g[kinds.notna()].groupby(kinds.dropna(), sort=True):
            rate = stats.proportion((kinds == kind).fillna(False).to_numpy(bool), g["episode_id"].to_numpy())
            rows.append({**key, "kind": kind, "count": len(e), "n": len(g), "episodes": rate.episodes, "rate": rate.est,
                         "rate_low": rate.low, "rate_high": rate.high, "example": str(e["error"].iloc[0])[:120]})
    return pd.DataFrame(rows, columns=["run_label", "kind", "count", "n", "episodes", "rate", "rate_low", "rate_high",
                                       "example"])


def outcome_counts(df: pd.DataFrame, by: tuple[str, ...] = ("run_label", "condition")) -> pd.DataFrame:
    """Samples of each label per run and condition, labels in the fixed order (groups in order of appearance)."""
    counts = pd.crosstab([df[c] for c in by], df["label"])
    counts = counts.reindex(pd.MultiIndex.from_frame(df[list(by)].drop_duplicates()))  # order of appearance
    extra = [c for c in counts.columns if c not in LABELS]
    return counts.reindex(columns=[*LABELS, *extra], fill_value=0).fillna(0).astype(int)


def with_call_format(df: pd.DataFrame) -> pd.DataFrame:
    """`call_format` filled for every record: `no call` for a record without calls, `unrecorded` for a
    record with calls written before the grader recorded their format."""
    fmt = (df["call_format"] if "call_format" in df else pd.Series(None, index=df.index)).astype(object)
    calls = df["tool_calls"] if "tool_calls" in df else pd.Series("[]", index=df.index)
    missing = calls.map(lambda t: "no call" if t is None or pd.isna(t) or t == "[]" else "unrecorded")
    return df.assign(call_format=fmt.where(fmt.notna(), missing))


def outcomes(df: pd.DataFrame, by: tuple[str, ...] = ("run_label", "condition")) -> pd.DataFrame:
    """Share of each label per run and condition (rows sum to 1), labels in the fixed order; `n` the samples."""
    counts = outcome_counts(df, by)
    return counts.div(counts.sum(axis=1), axis=0).assign(n=counts.sum(axis=1))


def cells(df: pd.DataFrame) -> pd.DataFrame:
    """Rates per run, condition and value of the varied grid parameters, marked control or limit."""
    by = ["run_label", "condition", *grid_columns(df), "expected"]
    out = rates(df, by)
    out["cell"] = np.where(out["expected"] == "complied", "control", "limit")
    return out
