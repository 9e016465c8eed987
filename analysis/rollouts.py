"""The report's rollout sections, shown when an episode ran more than one step (experiment.mode=rollouts):
violations per rollout and time to first violation per arm, prompt-cache reuse per bar update strategy
and cadence, cost and latency per step, pass^k over replicates. (Thinking against context length is the
report's own section: each step is a model call like any other.)
Steps are the run's records (analysis.load.load_records), rollouts its rollouts.jsonl (load_rollouts).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.load import prompt_rows
from analysis.section import Section, ci
from analysis.stats import BOUNDED_NOTE, Estimate, bounded_mean, episode_means, pass_hat_k, proportion
from analysis.style import COLUMN_WIDTH, colors, save
from harness.context.strategy import shared_prefix
from harness.types import canonical_json


def multi_step(df: pd.DataFrame) -> bool:
    """Whether any rollout of the records ran past its first step (a live rollout run)."""
    return bool(len(df)) and bool((df["step"] > 0).any())


def with_prompt_reuse(steps: pd.DataFrame, run_dirs: list[Path]) -> pd.DataFrame:
    """Each step with `prompt_text_chars` and `prompt_chars_kept`, the characters its prompt shares with
    its rollout's previous prompt (what a prefix cache could keep)."""
    texts = {sha: prompt_text(row) for sha, row in prompt_rows(run_dirs).items()}
    ordered = steps.sort_values(["rollout_id", "step"])
    lengths, kept, previous = {}, {}, {}
    for idx, rid, sha in zip(ordered.index, ordered["rollout_id"], ordered["prompt_sha256"]):
        text = texts.get(sha, "")
        lengths[idx] = len(text)
        kept[idx] = shared_prefix(previous[rid], text) if rid in previous else math.nan
        previous[rid] = text
    return steps.assign(prompt_text_chars=pd.Series(lengths), prompt_chars_kept=pd.Series(kept))


def prompt_text(row: dict) -> str:
    """A prompt as the model saw it: rendered, where the backend rendered it; else each message's
    role, content and calls in order (what a prefix cache could keep, up to the template's markup)."""
    if row.get("rendered"):
        return row["rendered"]
    return "".join(f"<{m.get('role')}>{m.get('content') or ''}{canonical_json(m['tool_calls']) if m.get('tool_calls') else ''}"
                   for m in row.get("messages") or [])


def _est(e: Estimate) -> str:
    return ci([e.est], [e.low], [e.high])[0]


def strategy(status: object) -> str:
    """The bar's update strategy of a condition (its `condition_config.status` column, JSON text or
    null): replace, append, or reflow (no bar: state reaches the model through tool results only), as
    harness.context.strategy names them; with its cadence where the bar is not shown at every turn end."""
    if not isinstance(status, str):
        return "reflow"
    bar = json.loads(status)
    cadence = bar.get("cadence", "every")
    shown = {"every": "", "every_k": f", every {bar.get('cadence_k')} turn ends", "on_change": ", on change",
             "at_limit": ", at the limit"}.get(cadence, f", {cadence}")
    return f"{bar['update']}{shown}"


def violations(rollouts: pd.DataFrame) -> Section:
    rows = []
    ks = range(1, int(rollouts.groupby(["condition", "episode_id"]).size().min()) + 1)
    for cond, g in rollouts.groupby("condition", sort=True):
        episodes = g["episode_id"].to_numpy()
        per_episode = g.assign(clean=g["violations"] == 0).groupby("episode_id")["clean"].agg(["sum", "size"])
        row = {"condition": cond, "rollouts": len(g),
               "outcomes": ", ".join(f"{k} {v}" for k, v in g["outcome"].value_counts().sort_index().items()),
               "episodes": g["episode_id"].nunique(),
               **violation_measures(g, int(rollouts["steps"].max())),
               "rollouts with a violation (95% CI)": _est(proportion((g["violations"] > 0).to_numpy(float), episodes)),
               "mean steps": f"{g['steps'].mean():.1f}", "mean turns": f"{g['turns'].mean():.1f}"}
        for k in list(ks)[:3]:
            row[f"pass^{k} (95% CI)"] = _est(pass_hat_k(per_episode['sum'].to_numpy(), per_episode['size'].to_numpy(), k))
        rows.append(row)
    return Section("Rollouts: violations per rollout",
                   "A violation is a step labelled `violated` by the family's grader (a call to the target once the "
                   "limit was reached; loop_guard: a page read again; failure_streak: a retry at or past 3 failures; "
                   "todo_state: a step named that the live list does not hold there). "
                   "A rollout stops at the step limit, which caps its violations: violations per step (each rollout's "
                   "violations over its steps) is not capped, and the rollouts stopped by the limit are counted (their "
                   "violations per rollout are a floor, marked AT THE CAP where every rollout of the arm stopped there). "
                   f"The episode is the unit: intervals over episodes (violations: each episode's mean, {BOUNDED_NOTE}, "
                   "on [0, the most steps any rollout took] per rollout and [0, 1] per step; share: Korn-Graubard). "
                   "pass^k: the chance that k replicates of an episode all end without a violation, averaged over "
                   "episodes.", pd.DataFrame(rows))


def violation_measures(g: pd.DataFrame, most_steps: int) -> dict[str, str]:
    """One arm's violations per rollout (bounded by `most_steps`, the most steps any rollout took) and per
    step (not capped by the step limit), each over episodes, and its rollouts stopped at the step limit."""
    episodes = g["episode_id"].to_numpy()
    per_rollout = bounded_mean(episode_means(g["violations"].to_numpy(float), episodes), 0.0, float(most_steps))
    per_step = bounded_mean(episode_means((g["violations"] / g["steps"].clip(lower=1)).to_numpy(float), episodes), 0.0, 1.0)
    stopped = int((g["outcome"] == "step_limit").sum())
    at_cap = " AT THE CAP (every rollout stopped at the step limit: a floor)" if stopped == len(g) else ""
    return {"violations per rollout (95% CI)": _est(per_rollout) + at_cap, "violations per step (95% CI)": _est(per_step),
            "stopped at the step limit": f"{stopped} of {len(g)}"}


def kaplan_meier(rollouts: pd.DataFrame) -> pd.DataFrame:
    """Per arm and step: rollouts at risk, first violations, and the share still without a violation.
    A rollout that ended without a violation is censored after its last step."""
    rows = []
    for cond, g in rollouts.groupby("condition", sort=True):
        first = g["first_violation_step"].astype(float)
        last = np.where(first.isna(), g["steps"] - 1, first)
        clean = 1.0
        for step in range(int(last.max()) + 1):
            at_risk, events = int((last >= step).sum()), int((first == step).sum())
            clean *= 1 - events / at_risk
            rows.append({"condition": cond, "step": step, "at risk": at_risk, "first violations": events, "clean": clean})
    return pd.DataFrame(rows)


def survival(rollouts: pd.DataFrame, out: Path, palette: dict[str, str]) -> Section:
    from matplotlib.ticker import MaxNLocator

    km = kaplan_meier(rollouts)
    fig = _figure()
    ax = fig.axes[0]
    for cond, g in km.groupby("condition", sort=True):
        ax.step(g["step"], g["clean"], where="post", label=str(cond), color=palette[cond])
    ax.set(xlabel="step (model call of the rollout)", ylabel="share without a violation", ylim=(-0.02, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    save(fig, out, "rollout_survival")
    table = km.assign(clean=km["clean"].map(lambda v: f"{v:.2f}")).rename(columns={"clean": "share without a violation"})
    return Section("Time to first violation", "Per arm, Kaplan-Meier by step (0: the rollout's first model call); a "
                   "rollout that ended without a violation is censored at its last step.", table, figure="rollout_survival")


def _figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(COLUMN_WIDTH, 2.4), layout="constrained")
    fig.subplots()
    return fig


def cache(steps: pd.DataFrame) -> Section:
    rows = []
    for (cond, strat), g in steps.groupby(["condition", "strategy"], sort=True):
        reported = g[g["cached_prompt_tokens"].notna()]
        prompt = reported["prompt_tokens"].sum()
        cost = pd.to_numeric(g["cost_usd"], errors="coerce")
        latency = pd.to_numeric(g["latency_s"], errors="coerce")
        later = g[g["prompt_chars_kept"].notna()]
        kept = later["prompt_chars_kept"].sum() / later["prompt_text_chars"].sum() if len(later) else math.nan
        rows.append({"condition": cond, "bar update": strat, "steps": len(g),
                     "prompt kept from the previous step": "n/a" if math.isnan(kept) else f"{kept:.1%}",
                     "new characters per step": "n/a" if not len(later) else
                     f"{(later['prompt_text_chars'] - later['prompt_chars_kept']).mean():.0f}",
                     "prompt tokens per step": "n/a" if g["prompt_tokens"].isna().any() else f"{g['prompt_tokens'].mean():.0f}",
                     "steps reporting cache": len(reported),
                     "prompt tokens": int(prompt) if len(reported) else "n/a",
                     "cached prompt tokens": int(reported["cached_prompt_tokens"].sum()) if len(reported) else "n/a",
                     "cache-write tokens": _written(reported),
                     "reused": f"{reported['cached_prompt_tokens'].sum() / prompt:.1%}" if len(reported) and prompt else "n/a",
                     "cost per step (USD)": "n/a" if cost.isna().any() else f"{cost.mean():.6f}",
                     "latency per step (s)": "n/a" if latency.isna().all() else f"{latency.mean():.2f}"})
    return Section("Prompt-cache reuse per strategy",
                   "Per arm, its bar's update strategy and cadence (at which turn ends the bar is shown: every one, "
                   "every k-th, on a change, at the limit; violations per rollout above). Prompt kept: the share of each prompt (rendered text, else roles, contents and calls) that its "
                   "rollout's previous prompt began with, steps after the first: what a prefix cache can reuse under "
                   "each strategy, from the prompts alone. Cached prompt tokens: as the engine or API reported them "
                   "(hf prefix tree, vLLM prefix cache, OpenAI `cached_tokens`, Anthropic `cache_read_input_tokens`); "
                   "n/a where the backend reports none (scripted). Cache-write tokens: prompt tokens the provider wrote to "
                   "its cache (Anthropic `cache_creation_input_tokens`, billed above the input price); n/a where not reported.",
                   pd.DataFrame(rows))


def _written(steps: pd.DataFrame) -> str:
    written = pd.to_numeric(steps["cache_write_tokens"], errors="coerce") if "cache_write_tokens" in steps else None
    return "n/a" if written is None or written.isna().all() else str(int(written.sum()))


def browser_samples(steps: pd.DataFrame) -> pd.DataFrame:
    """Step records as the sample browser takes samples: each step a cell (`turn`, `step`), the arms of
    an episode paired step by step (so each arm's prompt, the bar as the model saw it at that step, sits
    beside the other arm's with the difference marked), the calls shown with the results they got."""
    return steps.assign(episode_id=steps["episode_id"] + " step " + steps["step"].astype(str),
                        tool_calls=steps["calls"], **{"params.turn": steps["turn"], "params.step": steps["step"]})


def sections(steps: pd.DataFrame, rollouts: pd.DataFrame, run_dirs: list[Path], out: Path) -> list[Section]:
    """The rollout sections of the report (each figure written into `out`)."""
    if rollouts.empty:
        return [Section("Rollouts", "No finished rollouts yet.")]
    strategies = dict(zip(rollouts["rollout_id"], rollouts.get("condition_config.status", pd.Series([None] * len(rollouts))).map(strategy)))
    steps = with_prompt_reuse(steps, run_dirs).assign(strategy=steps["rollout_id"].map(strategies).fillna("unfinished"))
    intro = Section("Rollouts", f"{len(rollouts)} finished rollouts, {len(steps)} model calls; records.jsonl holds one "
                    "record per model call (the tables above count each call as a decision), rollouts.jsonl one per rollout.")
    palette = colors(sorted(set(rollouts["condition"]) | set(steps["condition"])))  # one colour per arm in both figures
    return [intro, violations(rollouts), survival(rollouts, out, palette), cache(steps)]
