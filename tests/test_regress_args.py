"""analysis.regress on what a newcomer hands it: strict JSON, advice that fits the command given, and
runs of different models or backends refused (the gate compares one model before and after a change)."""
from __future__ import annotations

import json
from pathlib import Path

from analysis import regress
from tests.test_report_args import fake_run


def _strict(text: str):
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_has_null_where_an_interval_is_unknown(tmp_path: Path):
    a, b = fake_run(tmp_path / "a", ("none", "status_tail")), fake_run(tmp_path / "b", ("none", "status_tail"))
    assert regress.main([str(a), str(b), "--json", str(tmp_path / "gate.json")]) == 0
    out = _strict((tmp_path / "gate.json").read_text())  # one episode: no bootstrap interval
    assert out["tests"][0]["drop_low"] is None and out["tests"][0]["drop_high"] is None
    assert out["tests"][0]["drop"] == 0.0


def test_the_pair_by_params_refusal_does_not_advise_itself(tmp_path: Path, capsys):
    a = fake_run(tmp_path / "a", params={"calls_made": 2})
    b = fake_run(tmp_path / "b", params={"calls_made": 3})
    assert regress.main([str(a), str(b), "--pair-by", "params"]) == 2
    err = capsys.readouterr().err
    assert "the runs hold different episodes/replicates" in err and "pass --pair-by params" not in err
    assert "with --pair-by params the scenario name and grid parameters must match" in err


def test_runs_of_different_backends_are_refused(tmp_path: Path, capsys):
    a, b = fake_run(tmp_path / "a"), fake_run(tmp_path / "b", backend="hf")
    assert regress.main([str(a), str(b)]) == 2
    assert capsys.readouterr().err == (
        "statusbench regress: cannot compare: the runs differ in model or backend (baseline: model m on backend "
        "scripted, candidate: model m on backend hf); the gate compares one model with itself before and after a "
        "change: pass --allow-model-change to compare them anyway\n")
    assert regress.main([str(a), str(b), "--allow-model-change"]) == 0
    assert "note: MODEL OR BACKEND DIFFERS (baseline: model m on backend scripted" in capsys.readouterr().out
