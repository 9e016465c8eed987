"""A run killed with SIGKILL at random points and resumed ends with exactly the records of an
uninterrupted run: none lost, none duplicated, no torn line parsed as garbage."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TEST_MODEL, run_cli

pytestmark = pytest.mark.model
ARGS = [TEST_MODEL, "scenario.calls_made=[2,3,4]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
        "model.generation.max_new_tokens=4", "run.batch_size=1", "backend.batch_size=1", "run.report=false",
        "run.progress=false"]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


def test_sigkill_and_resume_loses_and_duplicates_nothing(tmp_path: Path):
    reference = run_cli(*ARGS, f"run.root={tmp_path / 'ref'}", "run.name=r")
    assert reference.returncode == 0, reference.stderr
    expected = {r["sample_id"]: (r["prompt_sha256"], r["text"]) for r in _records(tmp_path / "ref" / "status_ablation" / "r")}
    assert len(expected) == 6

    run_dir = tmp_path / "killed" / "status_ablation" / "k"
    rng = random.Random(7)
    kills = 0
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-m", "harness.run", *ARGS, f"run.root={tmp_path / 'killed'}", "run.name=k"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(3.0, 7.0))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        if (run_dir / "records.jsonl").exists():
            with open(run_dir / "records.jsonl", "a") as fh:  # what a kill in the middle of a write leaves
                fh.write('{"sample_id": "torn", "te')
    final = run_cli(*ARGS, f"run.root={tmp_path / 'killed'}", "run.name=k")
    assert final.returncode == 0, final.stderr
    records = _records(run_dir)  # every line parses: the torn tails were cut off
    assert [r["sample_id"] for r in records].count("torn") == 0
    assert len(records) == len({r["sample_id"] for r in records}) == 6
    # same ids, same rendered prompts, and (greedy) the same outputs as the uninterrupted run
    assert {r["sample_id"]: (r["prompt_sha256"], r["text"]) for r in records} == expected
    assert kills >= 1
    print(f"SIGKILLs survived: {kills}, records: {len(records)}, lost: {len(expected) - len(records)}")
