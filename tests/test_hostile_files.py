"""Files that are not files: a FIFO, a device, a directory or a huge sparse file where a run file or a
user's JSONL is expected is refused in one line naming the path, never waited on or read whole."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.backends.scripted import load_lines
from harness.errors import ConfigError
from harness.io import jsonl
from harness.io.jsonl import read_lines
from harness.rundir.store import RunDirError, read_jsonl
from tests.conftest import REPO


def _finishes(fn, seconds: float = 20.0) -> BaseException | None:
    """fn() run in a daemon thread; the exception it raised. Fails the test if it is still running
    (a reader blocked on a FIFO), instead of hanging the suite."""
    out: dict[str, BaseException] = {}

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the reader blocked"
    return out.get("exc")


def test_a_fifo_as_records_is_refused_not_waited_on(tmp_path: Path):
    os.mkfifo(tmp_path / "records.jsonl")
    exc = _finishes(lambda: read_jsonl(tmp_path / "records.jsonl"))
    assert isinstance(exc, RunDirError)
    assert str(exc) == f"{tmp_path / 'records.jsonl'} is not a regular file (a FIFO)"


def test_a_fifo_as_scripted_completions_is_a_config_error(tmp_path: Path):
    os.mkfifo(tmp_path / "c.jsonl")
    exc = _finishes(lambda: load_lines(str(tmp_path / "c.jsonl")))
    assert isinstance(exc, ConfigError) and "is not a regular file (a FIFO)" in str(exc) and "c.jsonl" in str(exc)


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"), (".", "a directory")])
def test_devices_and_directories_are_refused(path: str, kind: str):
    exc = _finishes(lambda: list(read_lines(path, error=ConfigError)))
    assert isinstance(exc, ConfigError) and str(exc) == f"{path} is not a regular file ({kind})"
    exc = _finishes(lambda: read_jsonl(Path(path)))
    assert isinstance(exc, RunDirError) and "is not a regular file" in str(exc)


def test_a_sparse_file_is_refused_at_its_first_long_line(tmp_path: Path):
    sparse = tmp_path / "records.jsonl"
    with open(sparse, "wb") as fh:
        fh.truncate(2 * 2**30)  # 2 GB of NULs, no newline, no disk used
    exc = _finishes(lambda: read_jsonl(sparse))
    assert isinstance(exc, RunDirError)
    assert str(exc) == f"{sparse} line 1 is longer than {jsonl.MAX_LINE_BYTES >> 20} MiB: not a JSON Lines file"


def test_lines_are_read_one_at_a_time(tmp_path: Path, monkeypatch):
    """Streaming, with the cap per line, not per file: many short lines pass a small cap."""
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 64)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"sample_id": "s{i}"}}\n' for i in range(1000)))
    assert len(read_jsonl(path)) == 1000
    path.write_text('{"sample_id": "s1"}\n{"sample_id": "' + "x" * 100 + '"}\n')
    with pytest.raises(RunDirError, match="line 2 is longer than"):
        read_jsonl(path)


def test_the_report_on_a_fifo_is_one_line_exit_2(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "records.jsonl")
    proc = subprocess.run([sys.executable, "-m", "analysis.report", str(run)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"statusbench: error: {run / 'records.jsonl'} is not a regular file (a FIFO)"
