"""Sweeps through a real SLURM scheduler: a one-node cluster on loopback (tests/slurm_cluster.py), the
`slurm_cpu` launcher (hydra-submitit-launcher), a two-task array (two scenario variants, each into its
own run directory), then preemption: `scontrol requeue` of one task mid-run and `scancel` of the other,
and a rerun that completes only what is missing, itself interrupted by the time-limit signal (SIGUSR2).
Skips, with the reason, where SLURM cannot start."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TEST_MODEL
from tests.fault_server import FaultServer
from tests.slurm_cluster import PARTITION, LocalSlurm, SlurmUnavailable

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs hydra-submitit-launcher (pip install -e .)")

SCENARIOS = ("xfinity", "verizon_email")
RUN_NAME = "run.name=${scenario.name}-${model.name}-${backend.name}"  # one run directory per array task
SLURM = ["-m", TEST_MODEL, "hydra/launcher=slurm_cpu", f"hydra.launcher.partition={PARTITION}", "hydra.launcher.cpus_per_task=1",
         f"scenario={','.join(SCENARIOS)}", RUN_NAME, "run.progress=false", "run.report=false"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local SLURM cluster: {exc}")
    yield cluster
    cluster.stop()


def sweep_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.run", *SLURM, *args]


def records(run_dir: Path) -> list[dict]:
    """The complete records of a run (a job still writing may have a partial last line)."""
    path = run_dir / "records.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line) for line in lines]


def test_two_task_array_on_slurm_with_the_embedded_model(slurm, tmp_path):
    grid = ["scenario.calls_made=[2]", "scenario.distractor_turns=[0]", "scenario.placement=[late]",
            "scenario.episodes_per_cell=1", "condition=[none,status_tail]", "model.generation.max_new_tokens=8"]
    proc = subprocess.run(sweep_cmd(*grid, f"run.root={tmp_path}"), cwd=REPO, env=slurm.env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + slurm.logs()
    sweep = tmp_path / "status_ablation"
    logs = {p.name for p in (sweep / ".submitit").iterdir() if p.is_dir()}
    array = min(logs, key=len)
    assert logs == {array, f"{array}_0", f"{array}_1"}  # one SLURM array of two tasks, each with its own logs
    runs = {s: sweep / f"{s}-smollm2-135m-hf" for s in SCENARIOS}
    for scenario, run_dir in runs.items():
        rows = records(run_dir)
        assert len(rows) == 2 and {r["scenario"] for r in rows} == {scenario}
        assert {r["condition"] for r in rows} == {"none", "status_tail"}
        assert all(r["error"] is None and not r["scripted"] and r["completion_tokens"] for r in rows)
        assert f"scenario={scenario}" in (run_dir / ".hydra" / "overrides.yaml").read_text()  # its own config
        session = json.loads((run_dir / "manifest.json").read_text())["sessions"][-1]
        assert session["new"] == 2 and "finished_at" in session
    for _ in range(100):  # a task's result is written just before its job step ends
        state = slurm.cmd("squeue", "-h", "-t", "all", "-j", array, "-o", "%i %T")
        if state.count("COMPLETED") == 2:
            break
        time.sleep(0.3)
    assert sorted(state.split()) == sorted([f"{array}_0", f"{array}_1", "COMPLETED", "COMPLETED"]), state
    report = subprocess.run([sys.executable, "-m", "analysis.report", *map(str, runs.values())], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    text = (sweep / "report" / "report.md").read_text()  # in the runs' common parent: the sweep directory
    side = text.split("## Runs side by side", 1)[1].split("## ", 1)[0]
    header = next(line for line in side.splitlines() if line.startswith("| condition"))
    assert all(run_dir.name in header for run_dir in runs.values()), side


def wait_for(check, timeout: float, what: str, proc: subprocess.Popen):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the sweep exited {proc.returncode} while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def task_ids(slurm: LocalSlurm) -> dict[int, str]:
    """Running array tasks: task index -> `ARRAYID_INDEX` (one task's own job id may equal the array's,
    and `scancel ARRAYID` would cancel every task)."""
    out = slurm.cmd("squeue", "-h", "-t", "running", "-o", "%K %i")
    return {int(k): a for k, a in (line.split() for line in out.splitlines()) if k.isdigit()}


def requeue_now(slurm: LocalSlurm, task: str, proc: subprocess.Popen) -> None:
    """A requeued job may start again only 120 s later (SLURM's fixed delay): as an admin would, lift it.
    Not within the second the job was killed in: slurmd refuses a launch credential that is not newer, in
    whole seconds, than the kill's revocation (`cred->ctime <= j->revoked` in slurm_cred.c), and the
    job ends FAILED without output ("already killed, do not launch batch job")."""
    wait_for(lambda: "PENDING" in slurm.cmd("squeue", "-h", "-j", task, "-o", "%T"), 60, f"{task} requeued", proc)
    time.sleep(math.floor(time.time()) + 1.1 - time.time())  # the kill was before PENDING was seen
    slurm.cmd("scontrol", "update", f"JobId={task}", "StartTime=now")


def test_requeue_resumes_and_a_cancelled_task_is_completed_by_a_rerun(slurm, tmp_path, capsys):
    grid = ["scenario.calls_made=[1,2,3,4,5]", "scenario.distractor_turns=[0]", "scenario.placement=[early,late]",
            "scenario.episodes_per_cell=2", "condition=[none,status_tail]", "run.batch_size=1"]
    with FaultServer(fates={"ok": 1.0}, delay_s=0.3) as server:
        api = ["model=qwen3-0.6b", "backend=openai", f"backend.base_url={server.base_url}", "backend.api_key_env=null",
               "backend.concurrency=1", f"run.root={tmp_path}", *grid]
        sweep = tmp_path / "status_ablation"
        runs = {s: sweep / f"{s}-qwen3-0.6b-openai" for s in SCENARIOS}
        planned = 40  # 5 calls_made x 2 placements x 2 episodes x 2 conditions
        log = tmp_path / "driver.log"
        with open(log, "w") as out:
            driver = subprocess.Popen(sweep_cmd(*api), cwd=REPO, env=slurm.env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: all(2 <= len(records(r)) < planned for r in runs.values()), 120, "both tasks mid-run",
                     driver)
            tasks = task_ids(slurm)
            assert set(tasks) == {0, 1}, tasks
            before = len(records(runs["xfinity"]))
            slurm.cmd("scontrol", "requeue", tasks[0])  # preemption of task 0: killed, back in the queue
            slurm.cmd("scancel", tasks[1])  # task 1 cancelled for good
            requeue_now(slurm, tasks[0], driver)
            driver.wait(timeout=240)
        finally:
            if driver.poll() is None:
                driver.kill()
        assert driver.returncode != 0  # the driver reports the cancelled task
        err = log.read_text()
        assert "CANCELLED" in err, err[-3000:]
        requeued = records(runs["xfinity"])
        requeued_ids = [r["sample_id"] for r in requeued]
        assert len(requeued_ids) == len(set(requeued_ids)) == planned  # none lost, none duplicated
        sessions = json.loads((runs["xfinity"] / "manifest.json").read_text())["sessions"]
        assert len(sessions) == 2 and sessions[1]["planned"] == planned
        resumed_from = planned - sessions[1]["new"]  # records on disk when the requeued job started again
        assert before <= resumed_from < planned  # stopped mid-run; the requeued job skipped what was done
        assert "finished_at" in sessions[1] and "finished_at" not in sessions[0]
        cancelled = len(records(runs["verizon_email"]))
        assert 2 <= cancelled < planned
        finished = (runs["xfinity"] / "records.jsonl").read_bytes()

        # the same command again; its task 1 gets SIGUSR2 mid-run, what SLURM sends `signal_delay_s` before
        # the time limit (and at preemption with a grace time): submitit checkpoints and requeues it itself
        with open(log, "w") as out:
            rerun = subprocess.Popen(sweep_cmd(*api), cwd=REPO, env=slurm.env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: len(records(runs["verizon_email"])) >= cancelled + 2 and 1 in task_ids(slurm), 120,
                     "the rerun's task 1 mid-run", rerun)
            task = task_ids(slurm)[1]
            slurm.cmd("scancel", "--signal=USR2", task)
            requeue_now(slurm, task, rerun)
            rerun.wait(timeout=240)
        finally:
            if rerun.poll() is None:
                rerun.kill()
    assert rerun.returncode == 0, log.read_text()[-3000:]
    assert (runs["xfinity"] / "records.jsonl").read_bytes() == finished  # the finished task is left alone
    assert json.loads((runs["xfinity"] / "manifest.json").read_text())["sessions"][-1]["new"] == 0
    ids = [r["sample_id"] for r in records(runs["verizon_email"])]
    assert len(ids) == len(set(ids)) == planned
    cancelled_run, signalled, resumed = json.loads((runs["verizon_email"] / "manifest.json").read_text())["sessions"]
    assert signalled["new"] == planned - cancelled and "finished_at" not in signalled
    assert cancelled < planned - resumed["new"] < planned and "finished_at" in resumed
    task_log = next((sweep / ".submitit").glob(f"{task}/*_log.out")).read_text()
    assert "this job is preempted" in task_log and f"Requeued job {task}" in task_log, task_log[-3000:]
    with capsys.disabled():  # in CI's log without -s
        print(f"\nslurm: cluster up in {slurm.startup_s:.1f}s; requeue: {before} records at `scontrol requeue`, "
              f"{resumed_from} when the requeued job restarted, {len(requeued)} at the end ({len(set(requeued_ids))} "
              f"distinct, {planned} planned); scancel: {cancelled} records when cancelled; rerun with SIGUSR2: "
              f"{planned - resumed['new']} when submitit's requeue restarted it, {len(ids)} at the end")


def test_a_missing_slurm_install_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM or munge binaries on it
    with pytest.raises(SlurmUnavailable, match=r"not installed: munged, .*sbatch.*apt-get install -y slurm-wlm munge"):
        LocalSlurm(tmp_path / "cluster").start()
    assert not (tmp_path / "cluster").exists()  # nothing started, nothing written
