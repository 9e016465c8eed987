"""One experiment per run directory.

A run's fingerprint is everything that decides which samples exist and how they are produced: the
scenario config, the conditions, the model's identity, the generation settings, the backend's
identity (every backend field it does not declare operational; a scripted file by its hash),
replicates and seed. Operational keys (batch sizes, progress, report, shard, retry_errors, where
the run is written) are not in it. A run into a directory that already holds another fingerprint is refused before anything is written, so two
configs are never pooled silently into one table; growing a run on purpose (more episodes,
conditions or replicates, another scripted file graded into it) takes `run.extend=true` and is
recorded in the manifest.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.flow.plan import PlanSpec
from harness.io.jsonl import read_regular
from harness.rundir.layout import MANIFEST, SHARDS_DIR
from harness.rundir.store import RunDirError
from harness.types import canonical_json

# keys run.extend=true may change: they add samples without changing how any sample is produced
GROWTH_PREFIXES = ("scenario.", "conditions.", "experiment.replicates", "backend.completions_sha256")


def fingerprint(spec: PlanSpec) -> dict[str, Any]:
    """Flat {dotted key: value}, JSON-comparable."""
    nested = {
        "scenario": asdict(spec.scenario),
        "conditions": {name: c.identity() for name, c in spec.conditions.items()},
        "model": spec.model.identity(),
        "generation": spec.model.generation.identity(),
        "backend": spec.backend.identity(),
        "experiment": {"replicates": spec.replicates, "seed": spec.seed},
    }
    if spec.rollout is not None:  # only then: a run of single decisions keeps the fingerprint it always had
        nested["rollout"] = {"mode": "rollouts", **spec.rollout.identity()}
    flat = {f"{group}.{key}": value for group, values in nested.items() for key, value in values.items()}
    return json.loads(canonical_json(flat))  # tuples -> lists: equal to what a manifest reads back


def differing(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k, "<absent>") != new.get(k, "<absent>"))


def _show(value: Any) -> str:
    text = "absent" if value == "<absent>" else json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class Admission:
    """What the manifest of the directory a job writes records: its fingerprint and extensions."""

    fingerprint: dict[str, Any]  # the directory's first
    current: dict[str, Any]  # this job's
    extensions: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "extensions": self.extensions}


def _manifests(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in [run_dir / MANIFEST, *sorted(run_dir.glob(f"{SHARDS_DIR}/*/{MANIFEST}"))]:
        if os.path.lexists(path):  # a FIFO in a manifest's place is refused, never skipped or waited on
            try:
                out.append((path, json.loads(read_regular(path, error=RunDirError))))
            except json.JSONDecodeError as exc:
                raise RunDirError(f"{path} line {exc.lineno} is not valid JSON ({exc.msg}): cannot check which "
                                  "experiment the run holds; restore it, or use another run.name=") from None
    return out


def admit(spec: PlanSpec, extend: bool, run_dir: Path, job_dir: Path, now: str) -> Admission:
    """Check the experiment against every manifest of the run (the run and its shards); raise RunDirError
    naming the differing keys, or return what job_dir's manifest must record. Reads only. `extend`:
    run.extend, growing the run on purpose."""
    fp = fingerprint(spec)
    own: dict[str, Any] = {}
    known: list[dict[str, Any]] = []
    legacy: list[Path] = []
    for path, m in _manifests(Path(run_dir)):
        if path.parent == Path(job_dir):
            own = m
        if "fingerprint" not in m:
            legacy.append(path)
            continue
        known += [m["fingerprint"], *(e["fingerprint"] for e in m.get("extensions", []))]
    fresh = Admission(own.get("fingerprint", fp), fp, list(own.get("extensions", [])))
    if fp in known or not (known or legacy):
        return fresh
    where = f"run directory {run_dir}"
    if not extend:
        if legacy and not known:
            raise RunDirError(f"{where} was written without a config fingerprint ({legacy[0]}), so it cannot be checked "
                              "to hold this experiment: use another run.name=, or run.extend=true to add to it anyway")
        keys = differing(known[-1], fp)
        shown = "; ".join(f"{k}: {_show(known[-1].get(k, '<absent>'))} -> {_show(fp.get(k, '<absent>'))}" for k in keys[:8])
        more = f" (and {len(keys) - 8} more)" if len(keys) > 8 else ""
        raise RunDirError(f"{where} holds another experiment; these keys differ: {', '.join(keys)} ({shown}{more}). "
                          "Give this one its own "
                          "run.name=..., or, to grow the run on purpose (more episodes, conditions, replicates, "
                          "another scripted file), pass run.extend=true")
    base = known[-1] if known else {}
    keys = differing(base, fp)
    fixed = [k for k in keys if not k.startswith(GROWTH_PREFIXES)] if known else []
    if fixed:
        raise RunDirError(f"{where}: run.extend=true only grows a run (keys starting {', '.join(GROWTH_PREFIXES)}); "
                          f"these keys change how samples are produced: {', '.join(fixed)}. Use another run.name=")
    return Admission(fresh.fingerprint, fp, fresh.extensions + [{"at": now, "fingerprint": fp, "changed": keys}])
