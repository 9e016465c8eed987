"""`python -m analysis.regress BASELINE_RUN CANDIDATE_RUN`: a CI gate on rule-following accuracy, tested
as the report shows it.

Both runs must hold the same episodes and replicates (same scenario config and seed), so every
candidate sample has a baseline twin. Episode ids hash the scenario's texts too, so after an edit of
the scenario's prompts (e.g. its policy sentence) pass `--pair-by params` to pair episodes by their
scenario name and grid parameters instead. For each condition the gate tests the report's headline,
balanced accuracy (limit and control cells weighing the same; a model that stops calling gains
nothing by it), then limit cells and control cells each (with --cells, each cell of the scenario
grid too): whether the candidate is worse, with a one-sided sign-flip permutation test over episodes (each
episode's accuracy change over its replicates is one observation: replicates of an episode are not
independent; for balanced accuracy each weighted by 1 / its kind's episodes); p-values are
corrected for the number of tests (Holm by default).
A drop fails the gate when its corrected p is below --alpha and the accuracy fell by at least
--min-effect. It also prints which rendered prompts changed (prompt_sha256 per episode and
condition), so a prompt edit shows up as such next to its effect.

Runs of live rollouts (experiment.mode=rollouts) are compared rollout by rollout: each rollout's
share of steps graded right, with its limit and control steps weighing the same (`balanced`), then
over its limit steps and its control steps alone, paired on (episode, replicate) and tested the same
way (a rollout's steps are not independent: the rollout is one observation, the episode the unit).

Exit status: 0 no significant drop, 1 a significant drop, 2 the runs cannot be compared.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from analysis import stats, tables
from analysis.load import grid_columns, load_records
from analysis.rollouts import multi_step
from harness.io.files import os_error_message
from harness.rundir.layout import PROMPTS, run_parts
from harness.rundir.store import read_jsonl

CORRECTIONS = ("holm", "bonferroni", "fdr_bh", "none")
KEYS = ["pair_key", "replicate"]


class NotComparable(ValueError):
    """The two runs do not hold the same samples."""


@dataclass
class CellTest:
    condition: str
    cell: str
    n: int
    episodes: int
    acc_baseline: float
    acc_candidate: float
    drop: float  # baseline minus candidate accuracy (balanced accuracy in cell `balanced`)
    drop_low: float  # 95% interval of the drop over episodes (Gaffke's bound on per-episode changes in [-1, 1])
    drop_high: float
    baseline_only_right: int
    candidate_only_right: int
    p_drop: float  # one-sided sign-flip over episodes
    p_adjusted: float = 1.0
    regression: bool = False


def with_pair_key(df: pd.DataFrame, pair_by: str) -> pd.DataFrame:
    """`pair_key`: the episode id, or (pair_by == "params") the scenario name and every grid parameter."""
    if pair_by == "episode" or df.empty:
        return df.assign(pair_key=df["episode_id"])
    cols = ["scenario", *sorted(c for c in df.columns if c.startswith("params."))]
    return df.assign(pair_key=df[cols].astype(str).agg("|".join, axis=1))


def rollout_outcomes(df: pd.DataFrame) -> pd.DataFrame:
    """One row per rollout: the share of its steps graded right over each kind of cell (`right_limit`,
    `right_control`; NaN where it took no such step) and with the kinds it took weighing the same
    (`right_balanced`), beside what names it (its first step's prompt stands for its prompts)."""
    kinds = {f"right_{kind}": df["correct"].astype(float).where(df["expected"] == expected)
             for kind, expected in tables.KINDS.items()}
    steps = df.assign(**kinds).sort_values("step")
    first = ["episode_id", "model", "model_path", "backend", "prompt_sha256",
             *(c for c in df.columns if c.startswith(("generation.", "params.")) or c == "scenario")]
    out = steps.groupby(["condition", *KEYS], sort=False).agg(
        **{c: (c, "first") for c in first}, **{k: (k, "mean") for k in kinds}).reset_index()
    return out.assign(right_balanced=out[list(kinds)].mean(axis=1))


def rollout_tests(base: pd.DataFrame, cand: pd.DataFrame, conditions: list[str]) -> list[CellTest]:
    """Per condition: each rollout's balanced, limit and control share right, paired (rollout_outcomes)."""
    out = []
    for cond in conditions:
        p = tables.pair(base[base["condition"] == cond], cand[cand["condition"] == cond], on=KEYS)
        for kind in ("balanced", *tables.KINDS):
            g = p.dropna(subset=[f"right_{kind}_a", f"right_{kind}_b"])
            if g.empty:
                continue
            a, b = g[f"right_{kind}_a"].to_numpy(), g[f"right_{kind}_b"].to_numpy()
            r = stats.paired(a, b, g["pair_key"].to_numpy())
            out.append(CellTest(cond, f"{kind} (per rollout)", r.n, r.episodes, r.acc_a, r.acc_b, 0.0 - r.diff,
                                0.0 - r.diff_high, 0.0 - r.diff_low, int((a > b).sum()), int((a < b).sum()), r.p_drop))
    return out


def check_one_config(df: pd.DataFrame, side: str) -> None:
    """A run pooling several configurations (e.g. grown with run.extend=true, or written before runs
    had fingerprints) has no single twin for a sample: name what is mixed or duplicated."""
    mixed = {c: [str(v) for v in sorted(df[c].dropna().unique())] for c in ["model", "model_path", "backend",
             *sorted(c for c in df.columns if c.startswith("generation."))] if c in df and df[c].nunique() > 1}
    if mixed:
        raise NotComparable(f"the {side} run mixes configurations ("
                            + "; ".join(f"{c}: {', '.join(v)}" for c, v in mixed.items())
                            + "); compare runs of one configuration each (one run.name per configuration)")
    dup = df.duplicated(["condition", *KEYS])
    if dup.any():
        first = df[dup].iloc[0]
        raise NotComparable(f"the {side} run holds {int(dup.sum())} samples more than once for the same condition, "
                            f"episode and replicate (e.g. condition {first['condition']!r}, episode {first['pair_key']}, "
                            f"replicate {first['replicate']}): several configurations pooled into one run directory"
                            " (or, with --pair-by params, episodes that share their grid parameters)")


def check_comparable(base: pd.DataFrame, cand: pd.DataFrame, pair_by: str = "episode",
                     allow_model_change: bool = False) -> tuple[list[str], list[str]]:
    """(conditions in both runs, notes about what is not compared); raises NotComparable, also when
    the runs differ in model or backend (every prompt and answer would differ for that reason alone)
    unless allow_model_change, which makes it a note."""
    if base.empty or cand.empty:
        raise NotComparable(f"the {'baseline' if base.empty else 'candidate'} run has no records")
    for side, df in (("baseline", base), ("candidate", cand)):
        check_one_config(df, side)
    setups = [(str(df["model"].iloc[0]), str(df["backend"].iloc[0])) for df in (base, cand)]
    if setups[0] != setups[1]:
        what = (f"baseline: model {setups[0][0]} on backend {setups[0][1]}, "
                f"candidate: model {setups[1][0]} on backend {setups[1][1]}")
        if not allow_model_change:
            raise NotComparable(f"the runs differ in model or backend ({what}); the gate compares one model with "
                                "itself before and after a change: pass --allow-model-change to compare them anyway")
    common = [c for c in dict.fromkeys(base["condition"]) if c in set(cand["condition"])]
    notes = [f"condition {c!r} is only in the {side} run; not compared"
             for side, df, other in (("baseline", base, cand), ("candidate", cand, base))
             for c in dict.fromkeys(df["condition"]) if c not in set(other["condition"])]
    if not common:
        raise NotComparable(f"no condition in common (baseline: {sorted(set(base['condition']))}, "
                            f"candidate: {sorted(set(cand['condition']))})")
    for cond in common:
        keys = [set(map(tuple, df.loc[df["condition"] == cond, KEYS].itertuples(index=False)))
                for df in (base, cand)]
        if keys[0] != keys[1]:
            only_b, only_c = sorted(keys[0] - keys[1]), sorted(keys[1] - keys[0])
            example = (only_b or only_c)[0]
            raise NotComparable(
                f"condition {cond!r}: the runs hold different episodes/replicates ({len(only_b)} only in the baseline, "
                f"{len(only_c)} only in the candidate, e.g. episode {example[0]} replicate {example[1]}); "
                "run the candidate with the baseline's scenario, replicates and seed"
                + (", or after an edit of the scenario's texts pass --pair-by params" if pair_by == "episode"
                   else " (with --pair-by params the scenario name and grid parameters must match)"))
    if setups[0] != setups[1]:
        notes.append(f"MODEL OR BACKEND DIFFERS ({what}): a drop or a changed prompt may be the model's, not the change's")
    return common, notes


def gate_tests(base: pd.DataFrame, cand: pd.DataFrame, conditions: list[str], *, alpha: float, min_effect: float,
               correction: str, cells: bool = False, rollouts: bool = False) -> list[CellTest]:
    """Per condition: balanced accuracy, limit cells, control cells (tables.cell_subsets) and with
    cells=True each cell of the scenario grid, one test each, corrected together. `rollouts`: base and
    cand are rollout_outcomes, tested rollout by rollout."""
    from statsmodels.stats.multitest import multipletests

    grid = grid_columns(pd.concat([base, cand], ignore_index=True)) if cells else []
    out: list[CellTest] = rollout_tests(base, cand, conditions) if rollouts else []
    for cond in [] if rollouts else conditions:
        p = tables.pair(base[base["condition"] == cond], cand[cand["condition"] == cond], on=KEYS)
        for r in tables.paired_rows(p, "pair_key", grid, pooled=False):
            drop = [0.0 - r[k] for k in ("diff", "diff_high", "diff_low")]  # 0.0 - x: no "-0.000" for no change
            out.append(CellTest(cond, r["cells"], r["n"], r["episodes"], r["acc_a"], r["acc_b"], *drop, r["only_a"],
                                r["only_b"], r["p_drop"]))
    raw = [t.p_drop for t in out]
    adjusted = raw if correction == "none" else multipletests(raw, alpha=alpha, method=correction)[1]
    for t, p_adj in zip(out, adjusted):
        t.p_adjusted = float(p_adj)
        t.regression = t.p_adjusted < alpha and t.drop >= min_effect
    return out


def _prompt_text(prompt: dict) -> str:
    """The text the model saw; for a backend that did not render (scripted, API), the messages one per block."""
    if prompt.get("rendered"):
        return prompt["rendered"]
    parts = []
    for m in prompt.get("messages") or []:
        parts.append(f"[{m.get('role')}]")
        parts += [str(m["content"])] if m.get("content") else []
        parts += [json.dumps(m["tool_calls"], sort_keys=True)] if m.get("tool_calls") else []
    return "\n".join([*parts, "[tools]", json.dumps(prompt.get("tools"), sort_keys=True)])


def _rendered(run_dir: Path) -> dict[str, str]:
    """prompt_sha256 -> prompt text, from the prompts.jsonl of the run (and of its shards)."""
    return {p["prompt_sha256"]: _prompt_text(p) for part in run_parts(run_dir) for p in read_jsonl(part / PROMPTS)}


def prompt_changes(base: pd.DataFrame, cand: pd.DataFrame, conditions: list[str]) -> pd.DataFrame:
    """Per condition: episodes whose rendered-prompt hash differs between the runs, with one example."""
    rows = []
    for cond in conditions:
        b = base[base["condition"] == cond].drop_duplicates("pair_key").set_index("pair_key")["prompt_sha256"]
        c = cand[cand["condition"] == cond].drop_duplicates("pair_key").set_index("pair_key")["prompt_sha256"]
        changed = (b != c.reindex(b.index))
        first = changed[changed].index[0] if changed.any() else None
        rows.append({"condition": cond, "episodes": len(b), "changed": int(changed.sum()), "example_episode": first,
                     "baseline_sha": b.get(first) if first else None, "candidate_sha": c.get(first) if first else None})
    return pd.DataFrame(rows)


def prompt_diff(base_dir: Path, cand_dir: Path, base_sha: str, cand_sha: str, max_lines: int = 40) -> str:
    old, new = _rendered(base_dir).get(base_sha), _rendered(cand_dir).get(cand_sha)
    if old is None or new is None:
        return "(prompt text not found in prompts.jsonl)"
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), "baseline", "candidate", lineterm="", n=1))
    return "\n".join(lines[:max_lines] + ([f"... {len(lines) - max_lines} more diff lines"] if len(lines) > max_lines else []))


def _table(tests: list[CellTest]) -> str:
    df = pd.DataFrame([asdict(t) for t in tests])
    return pd.DataFrame({
        "condition": df["condition"], "cell": df["cell"], "pairs": df["n"], "episodes": df["episodes"],
        "acc. baseline": df["acc_baseline"].map("{:.3f}".format), "acc. candidate": df["acc_candidate"].map("{:.3f}".format),
        "drop [95% CI]": [f"{d:+.3f} " + ("[–]" if pd.isna(lo) else f"[{lo:+.3f}, {hi:+.3f}]")  # no interval from one episode
                          for d, lo, hi in zip(df["drop"], df["drop_low"], df["drop_high"])],
        "baseline only right": df["baseline_only_right"], "candidate only right": df["candidate_only_right"],
        "p (one-sided)": df["p_drop"].map("{:.3g}".format), "p adjusted": df["p_adjusted"].map("{:.3g}".format),
        "verdict": df["regression"].map({True: "DROP", False: "ok"}),
    }).to_markdown(index=False)


def _finite(obj):
    """obj with every NaN or infinity (an interval from one episode) as None: JSON has no NaN."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.regress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline", type=Path, help="run directory of the reference (e.g. main's last run)")
    parser.add_argument("candidate", type=Path, help="run directory of the change under test")
    parser.add_argument("--alpha", type=float, default=0.05, help="family-wise significance level (default 0.05)")
    parser.add_argument("--min-effect", type=float, default=0.05,
                        help="smallest accuracy drop (0-1) that can fail the gate (default 0.05)")
    parser.add_argument("--correction", choices=CORRECTIONS, default="holm", help="multiple-comparison correction")
    parser.add_argument("--cells", action="store_true",
                        help="also test each cell of the scenario grid (more tests to correct for: less power for the headline)")
    parser.add_argument("--pair-by", choices=("episode", "params"), default="episode",
                        help="pair samples by episode id (default) or by scenario name + grid parameters "
                             "(after an edit of the scenario's texts, which changes episode ids)")
    parser.add_argument("--allow-model-change", action="store_true",
                        help="compare runs of different models or backends (refused by default)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the tests and prompt changes as JSON here (strict JSON: null where a number is unknown)")
    args = parser.parse_args(argv)
    if not 0 < args.alpha < 1 or not 0 <= args.min_effect <= 1:
        parser.error(f"--alpha must be in (0, 1) and --min-effect in [0, 1], got {args.alpha} and {args.min_effect}")
    try:
        base, cand = (with_pair_key(load_records([d]), args.pair_by) for d in (args.baseline, args.candidate))
        rollouts = multi_step(base) or multi_step(cand)
        if rollouts:
            base, cand = rollout_outcomes(base), rollout_outcomes(cand)
        conditions, notes = check_comparable(base, cand, args.pair_by, args.allow_model_change)
        changes = prompt_changes(base, cand, conditions)
        tests = gate_tests(base, cand, conditions, alpha=args.alpha, min_effect=args.min_effect, correction=args.correction,
                           cells=args.cells and not rollouts, rollouts=rollouts)
    except (FileNotFoundError, ValueError) as exc:  # NotComparable is a ValueError; so is an unpairable arm
        print(f"statusbench regress: cannot compare: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}")
    print("## Rendered prompts\n")
    for row in changes.itertuples(index=False):
        print(f"- {row.condition}: {row.changed} of {row.episodes} episodes changed"
              + (f" (e.g. episode {row.example_episode}: {row.baseline_sha[:12]} -> {row.candidate_sha[:12]})" if row.changed else ""))
        if row.changed:
            print("\n```diff\n" + prompt_diff(args.baseline, args.candidate, row.baseline_sha, row.candidate_sha) + "\n```")
    print(f"\n## Accuracy, candidate vs baseline (one-sided sign-flip test over episodes, {args.correction} over {len(tests)} tests, "
          f"alpha {args.alpha}, min effect {args.min_effect})\n\nCell `balanced`: balanced accuracy, the report's headline (limit and "
          "control cells weighing the same); `limit` / `control`: those cells alone" + ("; then each cell of the grid" if args.cells else "")
          + ".\n")
    print(_table(tests))
    failed = [t for t in tests if t.regression]
    if args.json:
        args.json.write_text(json.dumps(_finite({"regression": bool(failed), "tests": [asdict(t) for t in tests],
                                                 "prompt_changes": changes.to_dict(orient="records"), "notes": notes}),
                                        indent=2, allow_nan=False))
    if failed:
        print("\nFAIL: significant accuracy drop in " + "; ".join(f"{t.condition} [{t.cell}] {t.acc_baseline:.2f} -> "
                                                                f"{t.acc_candidate:.2f}" for t in failed))
        return 1
    print("\nPASS: no significant accuracy drop")
    return 0


def guarded_main(argv: list[str] | None = None) -> int:
    """main, with exit status 1 kept for a significant drop: anything else that fails (a full or
    read-only disk, a bug) exits 2, so a CI gate never reads a crash as a regression."""
    try:
        return main(argv)
    except OSError as exc:
        print(f"statusbench regress: error: {os_error_message(exc)}", file=sys.stderr)
    except Exception:
        import traceback

        traceback.print_exc()
    return 2


if __name__ == "__main__":
    sys.exit(guarded_main())
