from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.store import RunLockedError, RunStore, read_jsonl


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
    (tmp_path / "records.jsonl").write_text(json.dumps({"sample_id": "x", "schema_version": 0}) + "\n")
    with RunStore(tmp_path) as store, pytest.raises(ValueError, match="schema version"):
        store.done_ids()
