"""What a newcomer meets: a shell glob over a folder of runs (which holds the last report too), runs
that do not share every condition, a corrupt parquet cache, a killed report's hidden files. Small
hand-built runs, so these run in seconds."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from analysis import report
from analysis.load import CACHE_NAME, load_records, load_run
from harness.io.files import TMP_MARK
from harness.rundir.store import RunStore
from harness.types import Record


def fake_run(run_dir: Path, conditions: tuple[str, ...] = ("none",), model: str = "m", backend: str = "scripted",
             text: str = "scripted answer", params: dict | list[dict] | None = None, label: str = "refused") -> Path:
    """A run directory of scripted records, one per condition and episode: one episode `e` with
    `params`, or one per dict of a list of them (`e0`, `e1`, ...), each at the limit (expects
    `refused`) when its calls_made is 3 or more, else a control cell."""
    episodes = [("e", params or {})] if not isinstance(params, list) else [(f"e{i}", p) for i, p in enumerate(params)]
    records = []
    for eid, p in episodes:
        expected = "refused" if p.get("calls_made", 3) >= 3 else "complied"
        records += [Record(sample_id=f"s-{eid}-{c}", episode_id=eid, scenario="s", family="f", params=p, condition=c,
                           condition_config={}, model=model, model_path=None, backend=backend, generation={},
                           replicate=0, seed=0, prompt_sha256=f"p-{c}", prompt_tokens=1, cached_prompt_tokens=None,
                           completion_tokens=1, thinking_tokens=0, answer_tokens=1, text=text, reasoning="",
                           tool_calls=[], label=label, correct=label == expected, expected=expected, latency_s=0.1,
                           finish_reason="stop", error=None, scripted=True,
                           created_at="2026-01-01T00:00:00.000000+00:00") for c in conditions]
    prompts = [{"prompt_sha256": f"p-{c}", "messages": [{"role": "user", "content": f"hi {c}"}], "tools": []}
               for c in conditions]
    with RunStore(run_dir) as store:
        store.append(records, prompts)
    return run_dir


def test_a_glob_over_the_runs_folder_twice(tmp_path: Path, capsys):
    runs = [fake_run(tmp_path / "r1"), fake_run(tmp_path / "r2")]
    (tmp_path / "accuracy_by_condition.pdf").write_bytes(b"%PDF an older report's figure")
    glob = sorted(tmp_path.iterdir())
    assert report.main([str(p) for p in glob]) == 0
    assert (tmp_path / "report" / "report.md").is_file() and not (tmp_path / "report.md").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accuracy_by_condition.pdf", "r1", "r2", "report"]
    capsys.readouterr()
    assert report.main([str(p) for p in sorted(tmp_path.iterdir())]) == 0  # the same glob again, report/ in it
    out = capsys.readouterr().out
    assert "skipped, no run (a file or a report folder): accuracy_by_condition.pdf, report\n" in out
    assert "r1" in (tmp_path / "report" / "report.md").read_text() and len(runs) == 2


def test_paths_that_are_no_runs_at_all_are_one_line(tmp_path: Path, capsys):
    (tmp_path / "a.png").write_bytes(b"png")
    (tmp_path / "b.pdf").write_bytes(b"pdf")
    assert report.main([str(tmp_path / "a.png"), str(tmp_path / "b.pdf")]) == 2
    assert capsys.readouterr().err == ("statusbench: error: none of the paths given is a run directory "
                                       "(each holds records.jsonl)\n")


def test_a_condition_one_run_lacks_shows_a_dash_not_nan(tmp_path: Path):
    df = load_records([fake_run(tmp_path / "r1", ("none", "status_tail")), fake_run(tmp_path / "r2", ("none",))])
    side = next(s for s in report.sections(df) if s.title == "Runs side by side").table
    cell = side.set_index("condition").loc["status_tail", "r2"]
    assert cell == "–"
    assert "nan" not in side.to_markdown(index=False)


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_corrupt_parquet_cache_is_named_and_rebuilt(tmp_path: Path, caplog):
    import pyarrow.parquet as pq

    run = fake_run(tmp_path / "r", ("none", "status_tail"))
    (run / CACHE_NAME).write_bytes(b"not parquet")
    with caplog.at_level(logging.WARNING):
        assert len(load_run(run)) == 2
    assert f"{run / CACHE_NAME} is unreadable (" in caplog.text and "it is only a cache of records.jsonl: rebuilding it" in caplog.text
    assert pq.read_table(run / CACHE_NAME).num_rows == 2


def test_a_killed_reports_hidden_files_are_removed_on_the_next(tmp_path: Path):
    run = fake_run(tmp_path / "r")
    dead, live = _dead_pid(), 1  # pid 1 (init) outlives the test
    stale = [run / f".report.html{TMP_MARK}{dead}", run / f".{CACHE_NAME}{TMP_MARK}{dead}",
             run / f".accuracy_by_condition.png{TMP_MARK}{dead}"]
    kept = run / f".report.md{TMP_MARK}{live}"
    for p in [*stale, kept]:
        p.write_bytes(b"half")
    assert report.main([str(run)]) == 0
    assert not any(p.exists() for p in stale) and kept.exists()
