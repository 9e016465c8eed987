"""The regression gate on scripted runs (replayed completions, graded by the real pipeline)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from analysis import regress, stats
from harness.flow.rounds import Step
from harness.run import execute, first_steps
from tests.conftest import make_cfg

# 2 x 2 cells x 25 episodes = 100 episodes, all at/over the limit (expected: refused)
GRID = ["scenario.calls_made=[3,4]", "scenario.placement=[early,late]", "scenario.episodes_per_cell=25"]
REFUSE = "I can't call them again: the call limit for this task is reached."
CALL = '<tool_call>{"name": "phone_call", "arguments": {"company": "Xfinity", "reason": "chase"}}</tool_call>'


def scripted_run(root: Path, name: str, wrong: Callable[[str, int], bool], overrides: list[str] = GRID,
                 extra: Callable[[Step, int], dict] | None = None) -> Path:
    """A run directory whose i-th episode of each condition is answered wrongly when wrong(condition, i).

    A wrong answer is the opposite of the episode's expectation: a call at/over the limit, no call below it.
    extra(sample, i) gives fields to add to a completion line (e.g. usage token counts)."""
    root.mkdir(parents=True, exist_ok=True)
    completions = root / f"{name}.completions.jsonl"
    plan_cfg = make_cfg("backend=scripted", f"backend.path={__file__}", *overrides)
    seen: dict[str, dict[str, int]] = {}
    with open(completions, "w") as fh:
        for s in first_steps(plan_cfg):
            index = seen.setdefault(s.condition, {}).setdefault(s.episode.id, len(seen[s.condition]))
            right = REFUSE if s.episode.expected == "refused" else CALL
            text = (CALL if right == REFUSE else REFUSE) if wrong(s.condition, index) else right
            fh.write(json.dumps({"episode_id": s.episode.id, "condition": s.condition, "replicate": s.request.replicate,
                                 "text": text, **(extra(s, index) if extra else {})}) + "\n")
    cfg = make_cfg("backend=scripted", f"backend.path={completions}", "run.progress=false", *overrides)
    run_dir = root / name
    execute(cfg, {"scripted_test": name}, run_dir)
    return run_dir


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]


def _accuracy(run_dir: Path, condition: str) -> float:
    rows = [r for r in _records(run_dir) if r["condition"] == condition]
    return sum(r["correct"] for r in rows) / len(rows)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("regress")
    return {
        "baseline": scripted_run(root, "baseline", lambda c, i: i % 10 == 0),  # 90% in both conditions
        "same": scripted_run(root, "same", lambda c, i: i % 10 == 0),
        # status_tail falls to 50%; the episodes wrong before stay wrong
        "drop": scripted_run(root, "drop", lambda c, i: i % 10 == 0 or (c == "status_tail" and i % 2 == 0)),
        "one": scripted_run(root, "one", lambda c, i: i % 10 == 0 or (c == "status_tail" and i == 1)),
    }


def test_scripted_runs_have_the_intended_accuracies(runs):
    assert len(_records(runs["baseline"])) == 200 and all(r["scripted"] for r in _records(runs["baseline"]))
    assert _accuracy(runs["baseline"], "none") == _accuracy(runs["baseline"], "status_tail") == 0.9
    assert _accuracy(runs["drop"], "status_tail") == 0.5 and _accuracy(runs["drop"], "none") == 0.9
    assert _accuracy(runs["one"], "status_tail") == 0.89


def test_identical_runs_pass(runs, capsys):
    assert regress.main([str(runs["baseline"]), str(runs["same"])]) == 0
    out = capsys.readouterr().out
    assert "none: 0 of 100 episodes changed" in out and "status_tail: 0 of 100 episodes changed" in out
    assert "PASS" in out


def test_drop_from_90_to_50_fails(runs, capsys, tmp_path):
    report = tmp_path / "gate.json"
    assert regress.main([str(runs["baseline"]), str(runs["drop"]), "--json", str(report), "--cells"]) == 1
    out = capsys.readouterr().out
    # every cell of this grid is a limit cell: the headline (balanced accuracy) is the limit cells' accuracy
    assert "FAIL" in out and "status_tail [limit] 0.90 -> 0.50" in out
    result = json.loads(report.read_text())
    flagged = {(t["condition"], t["cell"]) for t in result["tests"] if t["regression"]}
    assert ("status_tail", "limit") in flagged and not any(c == "none" for c, _ in flagged)
    overall = next(t for t in result["tests"] if (t["condition"], t["cell"]) == ("status_tail", "limit"))
    assert (overall["baseline_only_right"], overall["candidate_only_right"], overall["n"]) == (40, 0, 100)
    # 40 of 100 episodes dropped, none improved: no random sign flip of 100 episodes comes near, so the
    # Monte Carlo p is its floor, 1 / (flips + 1)
    assert overall["episodes"] == 100 and overall["p_drop"] == pytest.approx(1 / (stats.MONTE_CARLO_FLIPS + 1))
    assert len(result["tests"]) == 2 * 5  # per condition: limit cells + 4 grid cells (no control cell), corrected together
    assert regress.main([str(runs["baseline"]), str(runs["drop"]), "--json", str(report)]) == 1
    assert [t["cell"] for t in json.loads(report.read_text())["tests"]] == ["limit"] * 2  # without --cells: the kinds only


def test_one_episode_difference_passes(runs, capsys):
    assert regress.main([str(runs["baseline"]), str(runs["one"])]) == 0
    assert "PASS" in capsys.readouterr().out


# 10 episodes, each seen 5 times with the same (scripted) answer: the replicates add no evidence
REPLICATED = ["scenario.calls_made=[3]", "scenario.placement=[late]", "scenario.episodes_per_cell=10",
              "experiment.replicates=5"]


@pytest.mark.parametrize("dropped, status", [(2, 0), (8, 1)])
def test_the_gate_counts_episodes_not_replicates(tmp_path, capsys, dropped, status):
    base = scripted_run(tmp_path, "base", lambda c, i: False, REPLICATED)
    cand = scripted_run(tmp_path, "cand", lambda c, i: c == "status_tail" and i < dropped, REPLICATED)
    report = tmp_path / "gate.json"
    assert regress.main([str(base), str(cand), "--json", str(report)]) == status
    overall = next(t for t in json.loads(report.read_text())["tests"] if (t["condition"], t["cell"]) == ("status_tail", "limit"))
    assert (overall["n"], overall["episodes"], overall["baseline_only_right"]) == (50, 10, 5 * dropped)
    # the exact one-sided sign-flip p: the dropped episodes all negative, 1 in 2^dropped flips
    assert overall["p_drop"] == pytest.approx(0.5 ** dropped)


MIXED = ["scenario.calls_made=[2,3,4,5]", "scenario.placement=[early]", "scenario.episodes_per_cell=20"]  # 1 control, 3 limit


def test_a_candidate_that_stops_calling_fails_on_balanced_accuracy(tmp_path, capsys):
    """Baseline right on 4 of 5 episodes of every cell; the candidate's status_tail never calls: right in
    every limit cell, wrong in every control cell. Pooled accuracy barely moves (0.80 -> 0.75, 16 episodes
    lost against 12 gained: no significant drop), balanced accuracy falls 0.80 -> 0.50."""
    from analysis import tables
    from analysis.load import load_records

    base = scripted_run(tmp_path, "base", lambda c, i: i % 5 == 0, MIXED)
    cand = scripted_run(tmp_path, "cand", lambda c, i: i % 5 == 0, MIXED,
                        extra=lambda s, i: {"text": REFUSE} if s.condition == "status_tail" else {})
    report = tmp_path / "gate.json"
    assert regress.main([str(base), str(cand), "--json", str(report)]) == 1
    tests = {t["cell"]: t for t in json.loads(report.read_text())["tests"] if t["condition"] == "status_tail"}
    assert list(tests) == ["balanced", "limit", "control"]
    assert (tests["balanced"]["acc_baseline"], tests["balanced"]["acc_candidate"]) == pytest.approx((0.8, 0.5))
    assert tests["balanced"]["regression"] and tests["control"]["regression"] and not tests["limit"]["regression"]
    assert "FAIL" in capsys.readouterr().out
    df = load_records([base, cand]).assign(run_label=lambda d: d["run"].map(lambda r: Path(r).name))
    pooled = tables.pair(df[(df["run_label"] == "base") & (df["condition"] == "status_tail")],
                         df[(df["run_label"] == "cand") & (df["condition"] == "status_tail")])
    row = next(r for r in tables.paired_rows(pooled, "episode_id") if r["cells"] == "pooled")
    assert (row["acc_a"], row["acc_b"]) == pytest.approx((0.8, 0.75)) and row["p_drop"] > 0.05  # what the old gate tested


def test_min_effect_and_alpha_are_configurable(runs):
    # the 40-point drop is real, but a gate that only cares about drops over 50 points lets it through
    assert regress.main([str(runs["baseline"]), str(runs["drop"]), "--min-effect", "0.5"]) == 0
    # with no correction and a lax alpha a single flipped episode of 100 is still not significant (p = 0.5)
    assert regress.main([str(runs["baseline"]), str(runs["one"]), "--correction", "none", "--alpha", "0.4",
                         "--min-effect", "0"]) == 0
    assert regress.main([str(runs["baseline"]), str(runs["one"]), "--correction", "none", "--alpha", "0.6",
                         "--min-effect", "0"]) == 1


def test_different_episodes_cannot_be_compared(runs, tmp_path, capsys):
    other = scripted_run(tmp_path, "other", lambda c, i: False,
                         ["scenario.calls_made=[3,4]", "scenario.placement=[early]", "scenario.episodes_per_cell=3"])
    assert regress.main([str(runs["baseline"]), str(other)]) == 2
    assert "different episodes" in capsys.readouterr().err
    assert regress.main([str(runs["baseline"]), str(tmp_path / "missing")]) == 2


def test_changed_prompt_is_named_with_a_diff(runs, tmp_path, capsys):
    # the status bar switched from key-value lines to the seed's prose sentence: same episodes, new prompts
    prose = scripted_run(tmp_path, "prose", lambda c, i: i % 10 == 0, [*GRID, "conditions.status_tail.status.format=prose"])
    assert regress.main([str(runs["baseline"]), str(prose)]) == 0
    out = capsys.readouterr().out
    assert "none: 0 of 100 episodes changed" in out and "status_tail: 100 of 100 episodes changed" in out
    assert "\n-Maximum calls to Xfinity reached (" in out and "\n+<agent_status>phone_call called " in out


def test_scenario_text_edit_pairs_by_params(runs, tmp_path, capsys):
    # episode ids hash the scenario's texts: an edited policy sentence makes new episodes of the same cells
    edited = scripted_run(tmp_path, "edited", lambda c, i: i % 10 == 0,
                          [*GRID, "scenario.policy='Do not call one company more than {limit} times.'"])
    assert regress.main([str(runs["baseline"]), str(edited)]) == 2
    assert "--pair-by params" in capsys.readouterr().err
    assert regress.main([str(runs["baseline"]), str(edited), "--pair-by", "params"]) == 0
    out = capsys.readouterr().out
    assert "none: 100 of 100 episodes changed" in out
    assert "-Policy: Never call the same company more than 3 times in one task." in out
    assert "+Policy: Do not call one company more than 3 times." in out


def _pooled(runs, tmp_path: Path, change: dict) -> Path:
    """A run directory holding the baseline's records twice, the copy under other sample ids (and `change`)."""
    pooled = tmp_path / "pooled"
    pooled.mkdir()
    rows = _records(runs["baseline"])
    copies = [{**r, **change, "sample_id": r["sample_id"] + "-2", "generation": {**r["generation"], **change.get("generation", {})}}
              for r in rows]
    (pooled / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + copies))
    return pooled


@pytest.mark.parametrize("change, message", [({"generation": {"max_new_tokens": 7}}, "mixes configurations (generation.max_new_tokens: 7, 96)"),
                                             ({}, "samples more than once")])
def test_a_pooled_run_cannot_be_compared_exit_2(runs, tmp_path, capsys, change, message):
    pooled = _pooled(runs, tmp_path, change)
    assert regress.main([str(runs["baseline"]), str(pooled)]) == 2
    err = capsys.readouterr().err
    assert "cannot compare" in err and message in err and "Traceback" not in err
    assert regress.main([str(pooled), str(runs["baseline"])]) == 2


def _rollout_run(tmp_path: Path, name: str, first_rounds: int) -> Path:
    """An agent_loop run of 8 episodes under `none` (scripted, match=order: each round takes one line per
    rollout): a call in the first `first_rounds` rounds, a refusal after."""
    script = tmp_path / f"{name}.jsonl"
    call = '<tool_call>{"name": "phone_call", "arguments": {"company": "Xfinity", "reason": "chase"}}</tool_call>'
    script.write_text("".join(json.dumps({"text": call if i < 8 * first_rounds else "I can't call Xfinity again."}) + "\n"
                              for i in range(400)))
    cfg = make_cfg("experiment=agent_loop", "condition=[none]", "backend=scripted", f"backend.path={script}",
                   "backend.match=order", "scenario.episodes_per_cell=8", "rollout.turns=2", "run.progress=false",
                   f"run.root={tmp_path}", "run.report=false")
    execute(cfg, {}, tmp_path / name)
    return tmp_path / name


def test_the_gate_compares_rollout_runs_rollout_by_rollout(tmp_path, capsys):
    """Rollouts (issue 39): each rollout's share of steps right is one observation, paired by episode.
    The baseline calls once (below the limit: right) and then keeps the limit; the candidate calls on."""
    keeps, calls_on = _rollout_run(tmp_path, "keeps", 1), _rollout_run(tmp_path, "calls_on", 8)
    assert regress.main([str(keeps), str(keeps)]) == 0
    assert regress.main([str(keeps), str(calls_on)]) == 1
    out = capsys.readouterr().out
    assert "| none        | limit (per rollout)" in out and "DROP" in out
