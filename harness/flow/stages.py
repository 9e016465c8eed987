"""The run's stages before and after its rounds, each a function with typed inputs and outputs;
`harness.run.execute` calls them in order: plan -> open (lock, admit, record the config) -> resume
-> start the session -> rounds (harness.flow.rounds) -> close the session.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from harness.flow.fingerprint import Admission, admit
from harness.flow.plan import PlanSpec, Rollout
from harness.io.files import own_dir, write_file
from harness.measure.grading import ParsedCall
from harness.rundir import manifest
from harness.rundir.layout import RECORDS, ROLLOUTS, run_parts, shard_dir
from harness.rundir.records import as_record, read_record_rows, read_rollout_rows
from harness.rundir.store import RunDirError, RunStore, newest
from harness.types import Record, RolloutRecord, short_hash


@dataclass
class OpenRun:
    """A run directory this process writes: its lock held, its experiment admitted."""
    run_dir: Path
    job_dir: Path  # the run, or its shard
    store: RunStore
    admission: Admission
    resolved: dict[str, Any]
    sessions: list[dict[str, Any]] = field(default_factory=list)  # the earlier invocations
    model_info: dict[str, Any] = field(default_factory=dict)

    def write_manifest(self, session: dict[str, Any]) -> None:
        self.store.write_manifest(manifest.build(self.resolved, self.model_info, self.sessions + [session],
                                                 self.admission.record()))


@contextmanager
def open_run(spec: PlanSpec, run_dir: Path, extend: bool, resolved: dict[str, Any]) -> Iterator[OpenRun]:
    """Take the job directory's writer lock first, then admit the experiment: a process refused (in
    use, another experiment) has written nothing. The config is recorded by `start_session`."""
    job_dir = shard_dir(Path(run_dir), spec.shard)
    with RunStore(job_dir) as store:
        admission = admit(spec, extend, Path(run_dir), job_dir, manifest.now())
        yield OpenRun(Path(run_dir), job_dir, store, admission, resolved, store.read_manifest().get("sessions", []),
                      {**spec.model.identity(), "backend": spec.backend.name})


@dataclass
class Pending:
    """What a run still has to do: rollouts to continue (at their next step) and finished ones whose
    rollout record a kill cut off."""
    active: list[Rollout]
    unrecorded: list[Rollout]

    def steps_left(self) -> int:
        """An upper bound of the model calls still to make."""
        return sum(r.env.steps_left() for r in self.active)


def resume(plan: list[Rollout], run: OpenRun, retry_errors: bool) -> Pending:
    """Replay each rollout's stored steps (from the run and all its shards) through its environment,
    which continues at its next step; no model call is repeated. With retry_errors, a rollout whose
    last step is an `error` continues from that step (its new record supersedes the old)."""
    rows: list[dict[str, Any]] = []
    recorded: set[str] = set()
    for part in run_parts(run.run_dir):
        mine = part == run.job_dir  # only this job's files are repaired (a torn last line cut off)
        rows += read_record_rows(part / RECORDS, repair=mine)
        recorded |= {row["rollout_id"] for row in read_rollout_rows(part / ROLLOUTS, repair=mine)}
    stored: dict[str, list[Record]] = defaultdict(list)
    for row in newest(rows).values():  # the newest record of a step counts (a retried one)
        if row["schema_version"] == 1 and plan and not plan[0].frozen:
            raise RunDirError(f"{run.run_dir} holds rollout steps of record schema 1, written before rollouts and single "
                              "decisions became one loop; they cannot be continued (analysis still reads them): use "
                              "another run.name")
        rec = as_record(row)
        stored[rec.rollout_id].append(rec)
    for r in plan:
        steps = sorted(stored[r.rollout_id], key=lambda s: s.step)
        if retry_errors and steps and steps[-1].label == "error":
            steps.pop()
        replay(r, steps)
    # a rollout whose steps were cut off after its record was written runs on: its new record supersedes the old
    return Pending([r for r in plan if not r.env.done], [r for r in plan if r.env.done and r.rollout_id not in recorded])


def replay(r: Rollout, stored: list[Record]) -> None:
    """The stored steps through the environment, acting on the calls the grader parsed then; a
    history the environment no longer reproduces is refused."""
    for rec in stored:
        if r.env.done or rec.step != r.env.step:
            raise RunDirError(f"rollout {r.rollout_id}: stored step {rec.step} does not follow step {r.env.step - 1} "
                              "(records.jsonl was edited); use another run.name=")
        calls = [ParsedCall(**{k: c.get(k) for k in ParsedCall.__dataclass_fields__ if k in c}) for c in rec.tool_calls]
        executed = [asdict(c) for c in r.env.act(rec.completion(), calls)]
        if executed != rec.calls:
            raise RunDirError(f"rollout {r.rollout_id} step {rec.step}: replaying the stored calls executes other calls "
                              "than recorded (the environment changed since); use another run.name=")
        r.steps.append(rec)


def record_rollouts(run: OpenRun, ended: list[Rollout]) -> None:
    """The rollout record of each ended rollout (rollouts.jsonl); its step records are then let go."""
    run.store.append_rows(ROLLOUTS, [asdict(summarize(r)) for r in ended])
    for r in ended:
        r.steps = []


def summarize(r: Rollout) -> RolloutRecord:
    return RolloutRecord.summarize(r.steps, str(r.env.outcome), r.env.turn + 1, r.env.new_target_calls(),
                                   manifest.now("microseconds"))


def save_hydra_record(job_dir: Path, resolved: dict[str, Any]) -> None:
    """.hydra/ of the job: written after the lock and the fingerprint check, because Hydra's own dump
    (off in conf/config.yaml) would overwrite the record of a run this job is then refused into."""
    if not HydraConfig.initialized():
        return
    out = own_dir(job_dir / ".hydra")  # renamed into place, never written through a link
    write_file(out / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(resolved)))
    write_file(out / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(HydraConfig.get().overrides.task))))


def start_session(run: OpenRun, planned: int, new: int) -> dict[str, Any]:
    """Record the config (.hydra/) and this invocation in the manifest: once the model has loaded, so
    a model that fails to load leaves no manifest to block the corrected command."""
    save_hydra_record(run.job_dir, run.resolved)
    session = {"started_at": manifest.now(), "argv": sys.argv[1:], "planned": planned, "new": new,
               "fingerprint": short_hash(run.admission.current)}
    run.write_manifest(session)
    return session


def records_kept(run_dir: Path) -> int:
    """Record lines in the run and its shards (for the interruption message)."""
    kept = 0
    for part in run_parts(Path(run_dir)):
        path = part / RECORDS
        if path.is_file():
            with open(path, "rb") as fh:
                kept += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return kept
