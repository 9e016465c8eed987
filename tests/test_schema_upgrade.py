"""Runs written before the one loop (record schema 1), kept as written by statusbench then
(tests/data/schema1: a run of single decisions and a rollout run, scripted): the single-decision run
resumes (its sample ids are unchanged: nothing is asked again) and both are read by the one loader
and report; the rollout run is refused in one line, not continued on records it cannot replay."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.load import load_records, load_rollouts
from analysis.report import write_report
from harness.rundir.store import RunDirError
from harness.run import execute
from tests.conftest import make_cfg

DATA = Path(__file__).parent / "data" / "schema1"


def _copy(tmp_path: Path, name: str) -> Path:
    shutil.copytree(DATA / name, tmp_path / name)
    return tmp_path / name


def _args(tmp_path: Path) -> list[str]:
    return ["backend=scripted", f"backend.path={DATA / 'answers.jsonl'}", "backend.match=order", "run.report=false",
            "run.progress=false", "scenario.episodes_per_cell=1", f"run.root={tmp_path}"]


def test_a_run_of_single_decisions_from_schema_1_resumes_with_nothing_to_ask_and_reads(tmp_path: Path):
    run = _copy(tmp_path, "samples")
    before = (run / "records.jsonl").read_bytes()
    counts = execute(make_cfg(*_args(tmp_path), "scenario.placement=[early]"), {}, run)
    assert counts == {"planned": 6, "new": 0}
    assert (run / "records.jsonl").read_bytes() == before  # nothing rewritten, nothing added
    df = load_records([run])
    assert len(df) == 6 and (df["schema_version"] == 1).all()
    assert (df["rollout_id"] == df["sample_id"]).all() and (df["step"] == 0).all()  # step 0 of one-step rollouts
    assert len(load_rollouts([run])) == 6  # the rollout rows the resumed run wrote for them
    assert "## By condition" in write_report([run], tmp_path / "report")


def test_a_rollout_run_from_schema_1_is_read_and_refused_in_one_line(tmp_path: Path):
    run = _copy(tmp_path, "rollouts")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(RunDirError, match="record schema 1") as refused:
        execute(make_cfg("experiment=agent_loop", *_args(tmp_path), "rollout.turns=2"), {}, run)
    assert "\n" not in str(refused.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name in before} == before
    steps = load_records([run])
    assert len(steps) == 10 and steps["step"].max() > 0 and steps["correct"].notna().all()
    assert json.loads(steps["completion_tool_calls"].iloc[-1]) is not None  # its API-style calls kept
    assert len(load_rollouts([run])) == 2
    assert "## Rollouts: violations per rollout" in write_report([run], tmp_path / "report")


@pytest.mark.parametrize("file, field, value", [("records.jsonl", "step", '"1"'), ("records.jsonl", "label", "5"),
                                                ("rollouts.jsonl", "violations", '"3"')])
def test_rollout_records_of_the_wrong_type_are_named_in_one_line(tmp_path: Path, file: str, field: str, value: str):
    """Issue 41 item 9: `"step": "1"`, `"violations": "3"`, `"label": 5` in a rollout run stop the report
    and the resume with the file, line and field named (the one typed read), never a traceback."""
    from tests.conftest import run_cli

    script = tmp_path / "s.jsonl"
    script.write_text((json.dumps({"text": "I can't call Xfinity again."}) + "\n") * 20)
    args = ["experiment=agent_loop", "backend=scripted", f"backend.path={script}", "backend.match=order", "rollout.turns=2",
            "scenario.episodes_per_cell=1", f"run.root={tmp_path}", "run.name=r", "run.progress=false", "run.report=false"]
    assert run_cli(*args).returncode == 0
    path = tmp_path / "agent_loop" / "r" / file
    lines = path.read_text().splitlines()
    row = json.loads(lines[-1])
    row[field] = json.loads(value)
    path.write_text("\n".join(lines[:-1] + [json.dumps(row)]) + "\n")
    for proc in (run_cli(*args), subprocess.run([sys.executable, "-m", "analysis.report", str(path.parent), "--out",
                                                 str(tmp_path / "report")], capture_output=True, text=True)):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        [line] = [x for x in proc.stderr.splitlines() if x.strip()]
        assert f"{file} line {len(lines)}" in line and f"field {field!r}" in line
