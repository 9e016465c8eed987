from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.rundir.store import RunLockedError, RunStore, read_jsonl


def test_torn_last_line_is_cut_off_and_earlier_lines_kept(tmp_path: Path, caplog):
    path = tmp_path / "records.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b": "tor')
    assert read_jsonl(path, repair=True) == [{"a": 1}, {"a": 2}]
    assert "torn last line" in caplog.text
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'


def test_corrupt_middle_line_names_the_line(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"a": 1}\ngarbage\n{"a": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)


def test_second_writer_is_refused(tmp_path: Path):
    with RunStore(tmp_path):
        with pytest.raises(RunLockedError, match="in use"):
            with RunStore(tmp_path):
                pass
    with RunStore(tmp_path):  # released on exit
        pass


def test_records_of_another_schema_version_are_refused(tmp_path: Path):
    from harness.rundir.records import read_record_rows

    (tmp_path / "records.jsonl").write_text(json.dumps({"sample_id": "x", "schema_version": 0}) + "\n")
    with pytest.raises(ValueError, match="schema version 0"):
        read_record_rows(tmp_path / "records.jsonl")


def test_second_process_is_refused_and_a_dead_owner_lock_is_taken_over(tmp_path: Path):
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO, run_cli

    run_dir = tmp_path / "status_ablation" / "locked"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from harness.rundir.store import RunStore\n"
         f"with RunStore(Path({str(run_dir)!r})):\n    print('held', flush=True); time.sleep(600)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        completions = tmp_path / "c.jsonl"
        completions.write_text('{"text": "hi"}\n' * 30)
        args = ["backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={tmp_path}",
                "run.name=locked", "run.report=false"]
        res = run_cli(*args)
        assert res.returncode == 2 and f"in use by another statusbench process (pid {holder.pid})" in res.stderr
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        res = run_cli(*args)  # the kernel dropped the dead owner's lock
        assert res.returncode == 0, res.stderr
    finally:
        if holder.poll() is None:
            holder.kill()
