"""The openai backend against a faulty server: retryable faults are retried, the rest become error
records with their reason, nothing hangs past the timeout, the run finishes and loses no record.
And with an API key in the environment, no file the run writes contains it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.conftest import REPO, TEST_MODEL
from tests.fault_server import REJECTION, FaultServer

GRID = [TEST_MODEL, "scenario.calls_made=[2,3,4]", "scenario.placement=[early,late]", "scenario.episodes_per_cell=2"]
SECRET = "sk-statusbench-test-5f0c1e9a7b"


def _run(server: FaultServer, tmp_path: Path, *extra: str):
    env = {**os.environ, "STATUSBENCH_TEST_KEY": SECRET}
    return subprocess.run([sys.executable, "-m", "harness.run", "backend=openai", f"backend.base_url={server.base_url}",
                           "backend.api_key_env=STATUSBENCH_TEST_KEY", "backend.max_retries=2", "backend.timeout_s=1",
                           "backend.concurrency=4", f"run.root={tmp_path}", "run.name=faults", *GRID, *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_faults_are_retried_or_recorded_and_nothing_is_lost(tmp_path: Path):
    with FaultServer(seed=3) as server:
        res = _run(server, tmp_path)
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "status_ablation" / "faults"
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert len(records) == len({r["sample_id"] for r in records}) == 24  # every planned sample, once
    assert all(f in server.served for f in ("ok", "429", "500", "400", "hang", "drop"))
    errors = [r for r in records if r["label"] == "error"]
    ok = [r for r in records if r["label"] != "error"]
    assert ok and all(r["error"] is None and r["prompt_tokens"] for r in ok)
    # 400s are never retried: each one the server sent is exactly one error record with its message
    assert sum(REJECTION in r["error"] for r in errors) == server.served["400"]
    assert all(r["error"].startswith("openai: ") for r in errors)
    # retryable faults outnumber the errors they caused: the client retried them
    retryable = server.served["429"] + server.served["500"] + server.served["hang"] + server.served["drop"]
    assert len(errors) - server.served["400"] < retryable
    assert all(r["latency_s"] < 1.0 * 3 + 10 for r in records)  # bounded by timeout x attempts + backoff
    # the report's errors-by-kind table counts every error record under its kind
    from analysis.tables import error_kind

    section = (run_dir / "report.md").read_text().split("## Errors by kind", 1)[1].split("\n## ", 1)[0]
    for kind, n in Counter(error_kind(r["error"]) for r in errors).items():
        assert re.search(rf"\|\s*{re.escape(kind)}\s*\|\s*{n}\s*\|", section), (kind, n, section)


def test_api_key_never_reaches_a_file(tmp_path: Path):
    with FaultServer(seed=1, fates={"ok": 1.0}) as server:
        res = _run(server, tmp_path, "scenario.episodes_per_cell=1")
    assert res.returncode == 0, res.stderr
    assert f"Bearer {SECRET}" in server.auth_headers  # the key was used...
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in written) and any(p.name == "manifest.json" for p in written)
    for path in written:  # ...and appears in no record, manifest, Hydra dump, log or report
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in res.stdout + res.stderr


def test_retry_errors_reruns_failed_samples_and_the_newest_record_counts(tmp_path: Path):
    from analysis.load import load_records

    run_dir = tmp_path / "status_ablation" / "faults"
    # one server (its URL is part of the experiment): an outage where every sample fails, then it recovers
    with FaultServer(seed=0, fates={"500": 1.0}) as server:
        assert _run(server, tmp_path, "scenario.episodes_per_cell=1", "backend.max_retries=0").returncode == 0
        server.fates = {"ok": 1.0}
        plain = _run(server, tmp_path, "scenario.episodes_per_cell=1")
        assert "12 already done, 0 new" in plain.stdout  # errors are outcomes: kept unless asked
        res = _run(server, tmp_path, "scenario.episodes_per_cell=1", "run.retry_errors=true")
    assert res.returncode == 0 and "0 already done, 12 new" in res.stdout
    assert len((run_dir / "records.jsonl").read_text().splitlines()) == 24  # nothing rewritten, only appended
    df = load_records([run_dir])
    assert len(df) == 12 and not (df["label"] == "error").any()
