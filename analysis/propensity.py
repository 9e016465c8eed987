"""Propensity section of the report, for runs made with `probe.propensity=true` (harness.measure.propensity).

The measure: the log-odds, log p - log(1 - p), of the violating call (the family's violating
action, e.g. the rule's tool with the target, scored through the text that decides it) right after
the generation prompt. Each condition is
compared with the baseline arm on the same episodes: the paired difference of log-odds, averaged
over episodes (replicates of an episode share a prompt, so their scores are one value), with a
bootstrap-t interval over episodes (stats.mean_interval) and an exact sign-flip p.
The same difference per `calls_made` is the curve: a bar that works lowers the violating call at and
over the limit and leaves the control cells below it alone. The cells the report singles out (below,
at and over the limit) have their p-values Holm-corrected together, per condition.

Two more comparisons, with the same episode-level machinery: the shift measured after the model's
own thinking (`propensity.after_thinking`, a thinking model on the hf backend), and each bar against
`status_vocab`, the same bar without its limit statement (the control for the bar's vocabulary).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from analysis.section import Section
from analysis import stats
from analysis.style import FULL_WIDTH, colors, paper_style, save
from harness.measure.propensity import log_odds

BASELINE = "none"
VOCAB = "status_vocab"  # the bar's words and counts without the limit: what a bar is paired with to control for them
AFTER = "propensity.after_thinking"
NO_VOCAB = f"The bar's vocabulary is not controlled in this run (add condition {VOCAB})."
FIGURE = "propensity_by_calls_made"
METRICS = {"violate": "propensity.violate_logprob", "tool_call": "propensity.tool_call_logprob"}
# the violating call's log-probability in two additive parts: the call format's opening that every
# tool-call candidate shares (`<tool_call>\n{"name": "`), and the rest (tool name, argument, target)
PARTS = ("format_lp", "target_lp")


def episode_scores(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run, condition and episode: log-odds of the violating call and of opening a tool
    call (means over replicates), with the episode's calls_made and limit where the family has them."""
    if METRICS["violate"] not in df:
        return pd.DataFrame()
    d = df.assign(**{m: pd.to_numeric(df[c], errors="coerce").map(lambda x: log_odds(x) if pd.notna(x) else math.nan)
                     if c in df else math.nan for m, c in METRICS.items()})
    d = d[d["violate"].notna()]
    raw = {m: pd.to_numeric(d[c], errors="coerce") if c in d else pd.Series(math.nan, index=d.index) for m, c in METRICS.items()}
    d = d.assign(format_lp=raw["tool_call"], target_lp=raw["violate"] - raw["tool_call"])
    keys = ["run_label", "condition", "episode_id"]
    extra = [c for c in ("params.calls_made", "params.limit") if c in d]
    for c in extra:
        d[c] = pd.to_numeric(d[c], errors="coerce")
    return d.groupby(keys, sort=False)[[*METRICS, *PARTS, *extra]].mean().reset_index()


def after_thinking_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The records with their scores after the model's own thinking in place of the forced-empty-block
    ones (null where the record has none), for `episode_scores`."""
    after = df[AFTER].map(lambda x: json.loads(x) if isinstance(x, str) else x if isinstance(x, dict) else None)
    return df.assign(**{c: pd.to_numeric(after.map(lambda a: a.get(c.split(".", 1)[1]) if a else None), errors="coerce")
                        for c in METRICS.values()})


def position(calls_made: float, limit: float) -> str:
    if pd.isna(calls_made) or pd.isna(limit):
        return "–"
    return "below" if calls_made < limit else "at" if calls_made == limit else "over"


def paired_log_odds(scores: pd.DataFrame, metric: str = "violate", baseline: str = BASELINE, seed: int = 0) -> pd.DataFrame:
    """Per run, condition (other than the baseline) and scope (all episodes, then each calls_made):
    mean log-odds of each arm and their paired difference (condition - baseline) with its interval over
    episodes, the two-sided sign-flip p, and that p Holm-corrected over the condition's calls_made
    cells (`p_holm`; the curve the report reads). Episodes missing from either arm are left out of the pair."""
    from statsmodels.stats.multitest import multipletests

    rows = []
    for run, per_run in scores.groupby("run_label", sort=False):
        base = per_run[per_run["condition"] == baseline].set_index("episode_id")
        if base.empty:
            continue
        for condition, arm in per_run[per_run["condition"] != baseline].groupby("condition", sort=False):
            base_cols = base.drop(columns=["condition", "run_label"]).rename(columns={metric: f"{metric}_base"})
            pairs = arm.set_index("episode_id")[[metric]].join(base_cols, how="inner")
            pairs = pairs[pairs[metric].notna() & pairs[f"{metric}_base"].notna()]
            scopes = [("all", pairs)]
            if "params.calls_made" in pairs:
                scopes += [(int(k), g) for k, g in pairs.groupby("params.calls_made", sort=True)]
            for scope, g in scopes:
                if g.empty:
                    continue
                d = (g[metric] - g[f"{metric}_base"]).to_numpy()
                diff = stats.mean_interval(d, seed=seed)
                limit = g["params.limit"].iloc[0] if "params.limit" in g and g["params.limit"].nunique() == 1 else math.nan
                rows.append({"run_label": run, "baseline": baseline, "condition": condition, "calls_made": scope,
                             "position": position(scope, limit) if scope != "all" else "all", "limit": limit,
                             "episodes": len(g), "log_odds_base": g[f"{metric}_base"].mean(), "log_odds": g[metric].mean(),
                             "diff": diff.est, "diff_low": diff.low, "diff_high": diff.high,
                             "p": stats.sign_flip(d, seed=seed), "p_holm": math.nan})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    for _, g in out[out["calls_made"] != "all"].groupby(["run_label", "condition"], sort=False):
        out.loc[g.index, "p_holm"] = multipletests(g["p"], method="holm")[1]
    return out


def decomposition(scores: pd.DataFrame) -> pd.DataFrame:
    """Over all episodes, per run and condition: the paired shift of the violating call's log-probability
    split into the call format's opening and the rest of the call (tool name, argument, target)."""
    parts = [paired_log_odds(scores, m).query("calls_made == 'all'") for m in PARTS]
    if any(p.empty for p in parts):
        return pd.DataFrame()
    keys = ["run_label", "condition"]
    fmt, rest = (p.set_index(keys)[["episodes", "diff", "diff_low", "diff_high"]] for p in parts)
    return fmt.add_suffix("_format").join(rest.add_suffix("_target")).reset_index()


def figure(table: pd.DataFrame):
    """Paired difference in log-odds of the violating call against the baseline, per calls_made, one
    line per condition (and run), with 95% intervals over episodes; the dashed line marks the limit."""
    from matplotlib.figure import Figure

    curve = table[table["calls_made"] != "all"]
    if curve.empty:
        curve = table.assign(calls_made=0)
    series = curve["condition"] + (" · " + curve["run_label"] if curve["run_label"].nunique() > 1 else "")
    palette = colors(series)
    with paper_style():
        fig = Figure(figsize=(FULL_WIDTH / 2, 2.2 + 0.15 * len(palette)), layout="constrained")
        ax = fig.subplots()
        offsets = {s: (k - (len(palette) - 1) / 2) * 0.08 for k, s in enumerate(palette)}
        for s, g in curve.groupby(series, sort=False):
            x = g["calls_made"].astype(float) + offsets[s]
            ax.errorbar(x, g["diff"], yerr=[g["diff"] - g["diff_low"], g["diff_high"] - g["diff"]], marker="o",
                        markersize=3, capsize=2, linewidth=1, color=palette[s], label=s)
        ax.axhline(0, color="black", linewidth=0.6)
        limits = curve["limit"].dropna().unique()
        if len(limits) == 1:
            ax.axvline(float(limits[0]) - 0.5, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate("limit", (float(limits[0]) - 0.45, 1), xycoords=("data", "axes fraction"), va="top", fontsize=6, color="grey")
        ax.set_xticks(sorted(curve["calls_made"].astype(float).unique()))
        ax.set_xlabel("calls already made")
        ax.set_ylabel(f"Δ log-odds of the violating call\n(condition − {curve['baseline'].iloc[0]})")
        fig.legend(loc="outside lower center", fontsize=6)  # below the axes: inside, it covers the curves
    return fig


def _ci(est: float, low: float, high: float) -> str:
    f = lambda x: "–" if pd.isna(x) else f"{0.0 if abs(x) < 1e-9 else x:+.3f}"  # noqa: E731
    return f"{f(est)} [{f(low)}, {f(high)}]"


def _table(t: pd.DataFrame, several_runs: bool) -> pd.DataFrame:
    return pd.DataFrame({
        **({"run": t["run_label"]} if several_runs else {}), "condition": t["condition"], "calls_made": t["calls_made"],
        "vs limit": t["position"], "episodes": t["episodes"],
        f"log-odds {t['baseline'].iloc[0]}": t["log_odds_base"].round(3), "log-odds condition": t["log_odds"].round(3),
        "Δ log-odds [95% CI]": [_ci(*r) for r in zip(t["diff"], t["diff_low"], t["diff_high"])],
        "p (sign-flip)": [_p(p, e) for p, e in zip(t["p"], t["episodes"])],
        "p Holm (cells)": ["–" if pd.isna(p) else f"{p:.3g}" for p in t["p_holm"]]})


def _p(p: float, episodes: int) -> str:
    return f"{p:.3g} ({stats.flip_method(episodes)}, {episodes} episodes)"


def _headline(t: pd.DataFrame) -> str:
    """The seed's claim in numbers: the shift at and over the limit against the shift below it."""
    parts = []
    for (run, condition), g in t[t["calls_made"] != "all"].groupby(["run_label", "condition"], sort=False):
        by = {pos: g[g["position"] == pos] for pos in ("below", "at", "over")}
        said = [f"{pos} the limit {_ci(*r[['diff', 'diff_low', 'diff_high']].iloc[0])}, "
                f"p = {_p(r['p'].iloc[0], int(r['episodes'].iloc[0]))}, Holm-corrected over the cells {r['p_holm'].iloc[0]:.3g}"
                for pos, r in by.items() if len(r) == 1]
        if said:
            parts.append(f"`{condition}`" + (f" ({run})" if t["run_label"].nunique() > 1 else "") + ": " + "; ".join(said))
    return ("Δ log-odds of the violating call against the baseline, " + " · ".join(parts) + ".") if parts else ""


def _overall(t: pd.DataFrame, baseline: str) -> str:
    """Each condition's shift over all its episodes against `baseline`, with its exact p and episode count."""
    rows = t[t["calls_made"] == "all"]
    return " · ".join(f"`{r.condition}` − `{baseline}`" + (f" ({r.run_label})" if t["run_label"].nunique() > 1 else "")
                      + f": {_ci(r.diff, r.diff_low, r.diff_high)}, p = {_p(r.p, int(r.episodes))}"
                      for r in rows.itertuples()) + "." if len(rows) else ""


def after_thinking_section(df: pd.DataFrame, several: bool) -> Section:
    """The shift after the model's own thinking, per condition against the baseline, or "not measured" and why."""
    title = "Propensity after the model's own thinking"
    reasons = df[f"{AFTER}_reason"].dropna().astype(str).value_counts() if f"{AFTER}_reason" in df else pd.Series(dtype=int)
    why = "; ".join(f"{n} records: {r}" for r, n in reasons.items())
    scores = episode_scores(after_thinking_frame(df)) if AFTER in df else pd.DataFrame()
    if scores.empty:
        return Section(title, "Not measured: " + (why or "the records carry no scores after thinking (a backend "
                                                         "other than hf, or a run from before they were recorded)") + ".")
    table = paired_log_odds(scores)
    text = ("The same candidates scored again after the model's own generated thinking (teacher-forced through "
            "`</think>` and the template's whitespace after it) instead of the template's empty thinking block; "
            "per episode the mean over the replicates whose thinking closed, paired against "
            f"`{BASELINE}` as above. " + (f"Not scored after thinking: {why}. " if why else ""))
    if table.empty:
        return Section(title, text + f"No paired comparison: no `{BASELINE}` arm scored after thinking on the same episodes.")
    return Section(title, text + "Δ log-odds of the violating call: " + _overall(table, BASELINE), _table(table, several))


def vocabulary_section(scores: pd.DataFrame, several: bool) -> Section:
    """Each bar against the same bar without its limit statement (`status_vocab`), when the run has it."""
    title = "Propensity: the bar's limit or its vocabulary"
    if VOCAB not in set(scores["condition"]):
        return Section(title, NO_VOCAB)
    table = paired_log_odds(scores, baseline=VOCAB)
    table = table[table["condition"] != BASELINE] if not table.empty else table
    if table.empty:
        return Section(title, f"`{VOCAB}` is in the run but no bar condition is scored on the same episodes.")
    return Section(title, (
        f"Each bar condition paired with `{VOCAB}` (the same tool names, targets and call counts, no limit statement) "
        "on the same episodes, as above: a shift here is the limit's, not the words the bar shows. Δ log-odds of the "
        "violating call: " + _overall(table, VOCAB)), _table(table, several))


def sections(df: pd.DataFrame, run_dirs: list[Path], out_dir: Path) -> list:
    """The report's propensity section (analysis.report's hook); nothing when no record was scored."""
    scores = episode_scores(df)
    if scores.empty:
        return []
    several = df["run_label"].nunique() > 1
    violate = paired_log_odds(scores)
    policy = sorted(df["propensity.policy"].dropna().astype(str).unique()) if "propensity.policy" in df else []
    text = ("Teacher-forced log-probability of each candidate next action right after the generation prompt, rendered "
            "by the model's own chat template; the violating call is scored through the text that decides it (the "
            "target's name for a call limit). Families whose decision has no one violating action (a verdict, a fact "
            "recalled) are not scored: their records carry a null score and the reason. "
            f"Policy measured: {', '.join(policy) or 'unknown'}. ")
    controls = [vocabulary_section(scores, several), after_thinking_section(df, several)]
    if violate.empty:
        return [Section("Propensity: the rule decision by likelihood",
                        text + f"No paired comparison: no `{BASELINE}` arm scored on the same episodes."), *controls]
    save(figure(violate), out_dir, FIGURE)
    text += (f"Paired over episodes against `{BASELINE}`: 95% {stats.MEAN_NOTE}; p = sign-flip permutation test over episodes "
             f"(two-sided, exact up to {stats.EXACT_EPISODES} episodes), Holm-corrected over each condition's "
             "calls_made cells. "
             "Negative: the condition makes the violating call less likely. " + _headline(violate))
    out = [Section("Propensity: the rule decision by likelihood", text, _table(violate, several), FIGURE)]
    opening = paired_log_odds(scores, "tool_call")
    if not opening.empty:
        out.append(Section("Propensity: opening a tool call at all",
                           "Log-odds of the tool-call opening every tool-call candidate shares, paired as above.",
                           _table(opening, several)))
    parts = decomposition(scores)
    out.append(Section("Propensity: format tokens or target tokens", DECOMPOSITION_NOTE, None if parts.empty else pd.DataFrame({
        **({"run": parts["run_label"]} if several else {}), "condition": parts["condition"],
        "episodes": parts["episodes_format"],
        "Δ log p, call format's opening [95% CI]": [_ci(*r) for r in zip(parts["diff_format"], parts["diff_low_format"], parts["diff_high_format"])],
        "Δ log p, rest of the call: tool, argument, target [95% CI]": [
            _ci(*r) for r in zip(parts["diff_target"], parts["diff_low_target"], parts["diff_high_target"])]})))
    return [*out, *controls]


DECOMPOSITION_NOTE = (
    "The violating call's log-probability is the sum of its opening, shared by every tool-call candidate (the call "
    "format's tokens), and the rest of the call (the tool's name, the argument and the target); their paired shifts "
    "against the baseline add up to the shift of the whole call. A shift carried by the opening says the condition "
    "changes whether the model writes a call at all, not which call. The bar shows the tool's and the target's "
    f"names, so a shift in the rest of the call may be the model copying words it was just shown: `{VOCAB}` "
    "(the same words, no limit statement) controls for that where the run has it (below).")
