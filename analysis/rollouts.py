"""The report of a rollout run (experiment.mode=rollouts): violations per rollout and time to first
violation per arm, thinking per step against context length, prompt-cache reuse per bar update
strategy, cost and latency per step, pass^k over replicates.

    python -m analysis.rollouts RUN_DIR
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import browser
from analysis.report import to_html, to_markdown
from analysis.section import Section
from analysis.stats import Estimate, episode_means, mean_interval, ols_slope, pass_hat_k, proportion
from analysis.style import COLUMN_WIDTH, colors, paper_style, save
from analysis.tables import thinking_sources
from harness.context.strategy import shared_prefix
from harness.io.files import write_file
from harness.rundir.layout import PROMPTS, RECORDS, ROLLOUTS, run_parts
from harness.rundir.store import read_jsonl
from harness.types import canonical_json


def load(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per model call, one row per finished rollout) of a run and its shards; each step
    with `prompt_chars_kept`, the characters its prompt shares with its rollout's previous prompt."""
    parts = run_parts(Path(run_dir))
    steps = [row for p in parts for row in read_jsonl(p / RECORDS, required=("rollout_id", "step"))]
    # the newest line of a rollout counts: a rollout whose steps were cut off ran on and was recorded again
    rollouts = list({row["rollout_id"]: row for p in parts for row in read_jsonl(p / ROLLOUTS, required=("rollout_id",))}.values())
    texts = {row["prompt_sha256"]: prompt_text(row) for p in parts for row in read_jsonl(p / PROMPTS, required=("prompt_sha256",))}
    previous: dict[str, str] = {}
    for row in sorted(steps, key=lambda r: (r["rollout_id"], r["step"])):
        text = texts.get(row["prompt_sha256"], "")
        row["prompt_text_chars"] = len(text)
        row["prompt_chars_kept"] = shared_prefix(previous[row["rollout_id"]], text) if row["rollout_id"] in previous else None
        previous[row["rollout_id"]] = text
    return pd.DataFrame(steps), pd.DataFrame(rollouts)


def prompt_text(row: dict) -> str:
    """A prompt as the model saw it: rendered, where the backend rendered it; else each message's
    role, content and calls in order (what a prefix cache could keep, up to the template's markup)."""
    if row.get("rendered"):
        return row["rendered"]
    return "".join(f"<{m.get('role')}>{m.get('content') or ''}{canonical_json(m['tool_calls']) if m.get('tool_calls') else ''}"
                   for m in row.get("messages") or [])


def _ci(est: float, low: float, high: float, fmt: str = ".2f") -> str:
    if math.isnan(est):
        return "n/a"
    return f"{est:{fmt}}" if math.isnan(low) else f"{est:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def _est(e: Estimate) -> str:
    return _ci(e.est, e.low, e.high)


def strategy(config: dict) -> str:
    """The bar's update strategy of a condition: replace, append, or reflow (no bar: state reaches the
    model through tool results only), as harness.context.strategy names them."""
    status = (config or {}).get("status")
    return str(status["update"]) if status else "reflow"


def violations(rollouts: pd.DataFrame) -> Section:
    rows = []
    ks = range(1, int(rollouts.groupby(["condition", "episode_id"]).size().min()) + 1)
    for cond, g in rollouts.groupby("condition", sort=True):
        episodes = g["episode_id"].to_numpy()
        per_episode = g.assign(clean=g["violations"] == 0).groupby("episode_id")["clean"].agg(["sum", "size"])
        row = {"condition": cond, "rollouts": len(g),
               "outcomes": ", ".join(f"{k} {v}" for k, v in g["outcome"].value_counts().sort_index().items()),
               "episodes": g["episode_id"].nunique(),
               "violations per rollout (95% CI)": _est(mean_interval(episode_means(g["violations"].to_numpy(float), episodes))),
               "rollouts with a violation (95% CI)": _est(proportion((g["violations"] > 0).to_numpy(float), episodes)),
               "mean steps": f"{g['steps'].mean():.1f}", "mean turns": f"{g['turns'].mean():.1f}"}
        for k in list(ks)[:3]:
            row[f"pass^{k} (95% CI)"] = _est(pass_hat_k(per_episode['sum'].to_numpy(), per_episode['size'].to_numpy(), k))
        rows.append(row)
    return Section("Rollouts: violations per rollout",
                   "A violation is a step labelled `violated` by the family's grader (a call to the target once the "
                   "limit was reached; loop_guard: a page read again; failure_streak: a retry at or past 3 failures; "
                   "todo_state: a step named that the live list does not hold there). "
                   "The episode is the unit: intervals over episodes (violations: each episode's mean, t or "
                   "bootstrap; share: Korn-Graubard). pass^k: the chance that k replicates of an episode all end "
                   "without a violation, averaged over episodes.", pd.DataFrame(rows))


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


def thinking(steps: pd.DataFrame, out: Path, palette: dict[str, str]) -> Section:
    measured = steps["prompt_tokens"].notna().all()
    unit = "prompt tokens" if measured else "prompt characters"
    context = steps["prompt_tokens" if measured else "prompt_chars"].astype(float)
    think = pd.to_numeric(steps["thinking_tokens"], errors="coerce")
    rows, unmeasured = [], []
    fig = _figure()
    ax = fig.axes[0]
    for cond, idx in steps.groupby("condition", sort=True).groups.items():
        fit = ols_slope(context[idx].to_numpy(), think[idx].to_numpy(), steps.loc[idx, "episode_id"].to_numpy())
        ax.scatter(context[idx], think[idx], s=6, alpha=0.6, color=palette[cond], label=str(cond))
        # an arm in which no step thought has no slope to show: 0 [0, 0] would read as a measured flat one
        thought = bool(think[idx].gt(0).any())
        if not thought and not think[idx].isna().all():
            unmeasured.append(str(cond))
        rows.append({"condition": cond, "steps": len(idx), f"mean context ({unit})": f"{context[idx].mean():.0f}",
                     "mean thinking tokens": "n/a" if think[idx].isna().all() else f"{think[idx].mean():.1f}",
                     "count from": thinking_sources(steps.loc[idx].assign(thinking_tokens=think[idx])),
                     f"thinking per 1k {unit} (95% CI)": _ci(fit.slope * 1000, fit.low * 1000, fit.high * 1000) if thought else "not measured",
                     "p": "not measured" if not thought else "n/a" if math.isnan(fit.p_value) else f"{fit.p_value:.3g}"})
    ax.set(xlabel=f"context ({unit})", ylabel="thinking tokens")
    ax.legend()
    save(fig, out, "rollout_thinking")
    text = (f"OLS of each step's thinking tokens on its context length ({unit}) per arm, errors clustered by episode: the seed's claim is "
            "that thinking grows with the context without the bar and stays flat with it.")
    if unmeasured:
        text += (f" **Not measured** for {', '.join(f'`{c}`' for c in unmeasured)}: no step thought (0 thinking tokens "
                 "throughout), which is no evidence of a flat slope.")
    return Section("Thinking per step against context length", text, pd.DataFrame(rows), figure="rollout_thinking")


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
                     "steps reporting cache": len(reported),
                     "prompt tokens": int(prompt) if len(reported) else "n/a",
                     "cached prompt tokens": int(reported["cached_prompt_tokens"].sum()) if len(reported) else "n/a",
                     "cache-write tokens": _written(reported),
                     "reused": f"{reported['cached_prompt_tokens'].sum() / prompt:.1%}" if len(reported) and prompt else "n/a",
                     "cost per step (USD)": "n/a" if cost.isna().any() else f"{cost.mean():.6f}",
                     "latency per step (s)": "n/a" if latency.isna().all() else f"{latency.mean():.2f}"})
    return Section("Prompt-cache reuse per strategy",
                   "Prompt kept: the share of each prompt (rendered text, else roles, contents and calls) that its "
                   "rollout's previous prompt began with, steps after the first: what a prefix cache can reuse under "
                   "each strategy, from the prompts alone. Cached prompt tokens: as the engine or API reported them "
                   "(hf prefix tree, vLLM prefix cache, OpenAI `cached_tokens`, Anthropic `cache_read_input_tokens`); "
                   "n/a where the backend reports none (scripted). Cache-write tokens: prompt tokens the provider wrote to "
                   "its cache (Anthropic `cache_creation_input_tokens`, billed above the input price); n/a where not reported.",
                   pd.DataFrame(rows))


def _written(steps: pd.DataFrame) -> str:
    written = pd.to_numeric(steps["cache_write_tokens"], errors="coerce") if "cache_write_tokens" in steps else None
    return "n/a" if written is None or written.isna().all() else str(int(written.sum()))


def browser_samples(steps: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """Step records as the sample browser takes samples: each step a cell (`turn`, `step`), the arms of
    an episode paired step by step (so each arm's prompt, the bar as the model saw it at that step, sits
    beside the other arm's with the difference marked), the calls shown with the results they got."""
    return steps.assign(run=str(run_dir), run_label=run_dir.name, correct=steps["label"] == steps["expected"],
                        episode_id=steps["episode_id"] + " step " + steps["step"].astype(str),
                        tool_calls=steps["calls"], attention_ref=None,
                        **{"params.turn": steps["turn"], "params.step": steps["step"]})


def summary_lines(run_dir: Path) -> list[str]:
    """One line per arm for the console: rollouts, violations per rollout, share with a violation."""
    _, rollouts = load(run_dir)
    if rollouts.empty:
        return ["no finished rollouts yet"]
    return [f"{cond}: {len(g)} rollouts, {g['violations'].mean():.2f} violations per rollout, "
            f"{(g['violations'] > 0).mean():.0%} with a violation, {g['steps'].mean():.1f} steps each"
            for cond, g in rollouts.groupby("condition", sort=True)] + [f"wrote {Path(run_dir) / 'report.md'}"]


def write_rollout_report(run_dir: Path, out_dir: Path | None = None, browser_limit: int = browser.DEFAULT_LIMIT) -> str:
    """report.md and report.html (with the sample browser, steps as samples) of a rollout run."""
    run_dir = Path(run_dir)
    steps, rollouts = load(run_dir)
    out = Path(out_dir) if out_dir else run_dir
    out.mkdir(parents=True, exist_ok=True)
    if rollouts.empty:
        text = "# statusbench report\n\nNo finished rollouts yet.\n"
    else:
        strategies = dict(zip(rollouts["rollout_id"], rollouts["condition_config"].map(strategy)))
        steps = steps.assign(strategy=steps["rollout_id"].map(strategies).fillna("unfinished"))
        intro = Section("Rollout run", f"{len(rollouts)} finished rollouts, {len(steps)} model calls (each one sample "
                        "below); records.jsonl holds one record per model call, rollouts.jsonl one per rollout.")
        palette = colors(sorted(set(rollouts["condition"]) | set(steps["condition"])))  # one colour per arm in both figures
        with paper_style():
            parts = [intro, violations(rollouts), survival(rollouts, out, palette), thinking(steps, out, palette), cache(steps)]
        text = to_markdown(steps, [run_dir], parts)
    write_file(out / "report.md", text)
    samples = browser_samples(steps, run_dir) if not steps.empty else steps
    write_file(out / "report.html", to_html(text, out, browser.fragment(browser.collect(samples, [run_dir], browser_limit))))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.rollouts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a rollout run directory (records.jsonl, rollouts.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="where report.md and report.html go (default: the run)")
    args = parser.parse_args(argv)
    try:
        write_rollout_report(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        return 2
    print(f"statusbench: wrote {(args.out or args.run_dir) / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
