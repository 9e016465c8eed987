"""The run's stages as a user meets them: the lock before anything is written, one line on an
interruption, and an end that says where the report is (not the whole report on stdout)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.rundir.store import RunStore
from harness.run import first_steps
from tests.conftest import REPO, make_cfg, run_cli
from tests.fault_server import FaultServer

GRID = ["scenario.calls_made=[3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
        "scenario.other_companies=[1]"]


def _scripted(path: Path, text: str = "I can't call Xfinity again.") -> Path:
    plan = first_steps(make_cfg("backend=scripted", f"backend.path={__file__}", *GRID))
    path.write_text("".join(json.dumps({"episode_id": s.episode.id, "condition": s.condition, "text": text}) + "\n"
                            for s in plan))
    return path


def test_a_refused_process_writes_nothing_into_a_run_in_use(tmp_path: Path):
    """The lock is taken before admission and before .hydra/ is written: a second process on a run
    in use (here: another experiment) leaves the first one's recorded config as it was."""
    args = ["backend=scripted", f"backend.path={_scripted(tmp_path / 'a.jsonl')}", f"run.root={tmp_path}",
            "run.name=r", "run.report=false", *GRID]
    assert run_cli(*args).returncode == 0
    run_dir = tmp_path / "status_ablation" / "r"
    before = (run_dir / ".hydra" / "config.yaml").read_text()
    with RunStore(run_dir):  # another process holding the run
        refused = run_cli(*args, "experiment.seed=99")
    assert refused.returncode == 2 and "in use" in refused.stderr, refused.stderr
    assert (run_dir / ".hydra" / "config.yaml").read_text() == before


def test_the_end_of_a_run_names_the_report_and_sums_it_up(tmp_path: Path):
    out = run_cli("backend=scripted", f"backend.path={_scripted(tmp_path / 'a.jsonl')}", f"run.root={tmp_path}",
                  "run.name=r", "run.progress=false", *GRID)
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "status_ablation" / "r"
    assert f"report: {run_dir / 'report.html'}" in out.stdout
    assert "2 samples: 2 refused" in out.stdout and "balanced accuracy: none " in out.stdout
    assert "# statusbench report" not in out.stdout  # the report is in its file, not on the terminal


def test_sigterm_says_in_one_line_what_is_kept(tmp_path: Path):
    with FaultServer(fates={"ok": 1.0}, delay_s=0.5) as server:  # slow enough to stop the job mid-run
        proc = subprocess.Popen([sys.executable, "-m", "harness.run", "model=qwen3-0.6b", "backend=openai",
                                 f"backend.base_url={server.base_url}", "backend.api_key_env=null",
                                 "backend.concurrency=1", "run.batch_size=1", f"run.root={tmp_path}", "run.name=r",
                                 "run.report=false", "run.progress=false", *GRID, "scenario.episodes_per_cell=20"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        run_dir = tmp_path / "status_ablation" / "r"
        deadline = time.time() + 120
        while not (run_dir / "records.jsonl").exists() and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    kept = len((run_dir / "records.jsonl").read_text().splitlines())
    assert err.strip().splitlines() == [f"statusbench: interrupted: {kept} records kept in {run_dir}; "
                                        "run the same command to continue"]


def test_a_wrong_model_path_is_one_line_and_leaves_nothing_that_blocks_the_fix(tmp_path: Path):
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "readme.txt").write_text("not weights")
    base = [f"run.root={tmp_path}", "run.name=r", "run.report=false", *GRID]
    for path, says in ((tmp_path / "no-such-dir", "does not exist"), (not_a_model, "not a model folder")):
        res = run_cli("model.gguf_package=null", f"model.path={path}", *base)
        assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    both = run_cli(f"model.path={not_a_model}", *base)  # the preset's package and a path
    assert both.returncode == 2 and "add model.gguf_package=null" in both.stderr, both.stderr
    assert not (tmp_path / "status_ablation" / "r" / "manifest.json").exists()
