"""Every user mistake gets a message naming the problem before any model loads, and exit code != 0."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

BAD = [
    # (overrides, fragment the message must contain)
    (["scenario.limitt=3"], "limitt"),
    (["scenario.limit=abc"], "scenario.limit"),
    (["scenario.limit=0"], "scenario.limit: must be >= 1"),
    (["scenario.calls_made=[-2]"], "scenario.calls_made"),
    (["scenario.distractor_turns=[-1]"], "scenario.distractor_turns"),
    (["scenario.other_companies=[99]"], "scenario.other_companies"),
    (["experiment.replicates=-1"], "experiment.replicates"),
    (["scenario=does_not_exist"], "scenario=does_not_exist: no such option"),
    (["model.path=/no/such/model", "model.gguf_package=null"], "model.path: directory '/no/such/model' does not exist"),
    (["model.gguf_package=no_such_weights_pkg"], "model.gguf_package"),
    (["backend=scripted", "backend.path=/no/such/file.jsonl"], "backend.path"),
    (["conditions.status_tail.status.format=xml"], "expected one of [kv, prose]"),
    (["condition=[]"], "select at least one condition"),
]


@pytest.mark.parametrize("overrides, fragment", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_is_named(tmp_path: Path, overrides, fragment):
    res = run_cli(*overrides, f"run.root={tmp_path}")
    assert res.returncode != 0
    assert fragment in res.stderr + res.stdout
    assert "Traceback" not in res.stderr
    assert not any(tmp_path.rglob("records.jsonl"))


def test_malformed_yaml_names_file_and_line(tmp_path: Path):
    (tmp_path / "scenario").mkdir()
    (tmp_path / "scenario" / "mine.yaml").write_text("defaults:\n  - xfinity_schema\nlimit: [3\n")
    res = run_cli("--config-dir", str(tmp_path), "scenario=mine", f"run.root={tmp_path}")
    assert res.returncode == 2 and "mine.yaml line 4" in res.stderr and "Traceback" not in res.stderr


def test_records_from_another_version_are_refused_and_kept(tmp_path: Path):
    run_dir = tmp_path / "status_ablation" / "old"
    run_dir.mkdir(parents=True)
    line = json.dumps({"sample_id": "x", "schema_version": 0}) + "\n"
    (run_dir / "records.jsonl").write_text(line)
    completions = tmp_path / "c.jsonl"
    completions.write_text('{"text": "hi"}\n')
    res = run_cli("backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={tmp_path}",
                  "run.name=old")
    assert res.returncode == 2 and "schema version" in res.stderr
    assert (run_dir / "records.jsonl").read_text() == line  # nothing already written is lost
