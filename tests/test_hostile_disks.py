"""Full and read-only disks: a clear message, nothing written before is lost, no empty or partial
file left; reports and the regression gate read a read-only run without writing its cache.
Needs root and `mount` (a small tmpfs, a read-only bind); skipped with the reason otherwise."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.io.files import TMP_MARK
from harness.rundir.store import read_jsonl
from tests.conftest import REPO, run_cli


def _mount(target: Path, *args: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount here (needs root and mount): {res.stderr.strip() or res.returncode}")


@pytest.fixture
def mounts():
    done: list[Path] = []

    def mount(target: Path, *args: str) -> Path:
        _mount(target, *args)
        done.append(target)
        return target

    yield mount
    for target in reversed(done):
        subprocess.run(["umount", str(target)], capture_output=True)


def _completions(tmp_path: Path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "I won't call again."}) + "\n")
    return path


def _files(root: Path) -> list[Path]:
    # .lock (the writer lock) and run.log (Hydra's log, empty when nothing is logged) are empty by design
    return [p for p in root.rglob("*") if p.is_file() and p.name not in (".lock", "run.log")]


def _module(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", name, *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_disk_full_during_a_run_keeps_complete_batches_and_says_so(tmp_path: Path, mounts):
    full = mounts(tmp_path / "full", "-t", "tmpfs", "-o", "size=200k", "tmpfs")
    res = run_cli("backend=scripted", f"backend.path={_completions(tmp_path)}", "backend.match=order", f"run.root={full}",
                  "scenario.episodes_per_cell=4", "run.batch_size=8", "run.progress=false")
    assert res.returncode == 2 and "the disk is full" in res.stderr and "Traceback" not in res.stderr, res.stderr
    files = _files(full)
    assert files and not [p for p in files if p.stat().st_size == 0]
    run = next(p.parent for p in files if p.name == "records.jsonl")
    records = read_jsonl(run / "records.jsonl")  # every line complete: no torn batch
    assert records and len(records) % 8 == 0 and len(records) < 48
    assert not [p for p in files if TMP_MARK in p.name]


def test_disk_full_while_writing_a_report_leaves_no_empty_figure(tmp_path: Path, mounts):
    root = tmp_path / "runs"
    assert run_cli("backend=scripted", f"backend.path={_completions(tmp_path)}", "backend.match=order", f"run.root={root}",
                   "run.report=false").returncode == 0
    full = mounts(tmp_path / "full", "-t", "tmpfs", "-o", "size=64k", "tmpfs")
    res = _module("analysis.report", str(root / "status_ablation" / "smollm2-135m-scripted-xfinity"), "--out", str(full / "rep"))
    assert res.returncode == 2 and "the disk is full" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not [p for p in _files(full) if p.stat().st_size == 0 or TMP_MARK in p.name]


def test_a_read_only_run_is_reported_and_gated_without_its_cache(tmp_path: Path, mounts):
    root = tmp_path / "runs"
    assert run_cli("backend=scripted", f"backend.path={_completions(tmp_path)}", "backend.match=order", f"run.root={root}",
                   "run.report=false").returncode == 0  # no parquet cache yet: analysis will try to write one
    ro = mounts(tmp_path / "ro", "--bind", str(root / "status_ablation" / "smollm2-135m-scripted-xfinity"))
    if subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True).returncode != 0:
        pytest.skip("cannot remount the bind read-only here")
    rep = _module("analysis.report", str(ro), "--out", str(tmp_path / "rep"))
    assert rep.returncode == 0, rep.stderr
    assert (tmp_path / "rep" / "report.md").exists() and not (ro / "records.parquet").exists()
    gate = _module("analysis.regress", str(ro), str(ro))
    assert gate.returncode == 0 and "PASS" in gate.stdout, gate.stdout + gate.stderr


def test_the_gate_exits_1_only_for_a_drop(monkeypatch, capsys):
    import errno

    from analysis import regress

    def full_disk(argv):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/records.parquet")

    monkeypatch.setattr(regress, "main", full_disk)
    assert regress.guarded_main([]) == 2 and "the disk is full (/runs/x/records.parquet)" in capsys.readouterr().err
    monkeypatch.setattr(regress, "main", lambda argv: 1 / 0)
    assert regress.guarded_main([]) == 2


def test_stale_conversion_folders_of_dead_processes_are_removed(tmp_path: Path):
    from harness.io.files import temporary_name
    from harness.models import sources
    from tests.conftest import make_cfg

    cfg = make_cfg(f"model.cache_dir={tmp_path}").model
    cache = tmp_path / "models"
    digest = sources._file_digest(sources._gguf_path(cfg))[:16]
    (cache / f"{cfg.name}-{digest}").mkdir(parents=True)  # already converted: resolve loads nothing
    sources.record_digests(cache / f"{cfg.name}-{digest}")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = cache / f".{cfg.name}-{digest}{TMP_MARK}{int(dead.stdout)}"  # a dead process's conversion
    live = temporary_name(cache / "other-model")  # a conversion in progress in this live process
    for d in (stale, live):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 1000)
    path, _ = sources.resolve(cfg)
    assert path == str(cache / f"{cfg.name}-{digest}")
    assert not stale.exists() and live.exists()
