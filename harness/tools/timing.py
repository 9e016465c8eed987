"""One harness run (single decisions or rollouts) timed from outside: the wall time of the whole run
and the part spent inside the backend's `generate`, with the prefill the records report (the
benchmark's and the peer comparison's measure)."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.backends import Backend
from harness.config.schemas import Config
from harness.run import execute
from harness.rundir.store import read_jsonl
from harness.types import Completion, Request


class TimedBackend(Backend):
    """Counts the wall time spent inside generate, so the rest of the run is the harness's."""

    def __init__(self, inner: Backend):
        self.inner, self.name, self.seconds = inner, inner.name, 0.0

    def generate(self, requests: list[Request]) -> list[Completion]:
        t0 = time.perf_counter()
        try:
            return self.inner.generate(requests)
        finally:
            self.seconds += time.perf_counter() - t0

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def hf_weights(self) -> Any:
        return self.inner.hf_weights()

    def scores_candidates(self) -> bool:
        return self.inner.scores_candidates()


def timed_run(cfg: Config, backend: Backend, run_dir: Path, **backend_cfg: Any) -> dict[str, Any]:
    """One harness run into run_dir with the backend's config changed as given, on an empty prefix cache
    (what an earlier run computed would be served from it); its timings and records."""
    backend.reset_prefix_cache()
    saved = backend.cfg
    backend.cfg = replace(saved, **backend_cfg)
    timed = TimedBackend(backend)
    try:
        t0 = time.perf_counter()
        execute(cfg, {}, run_dir, backend=timed)  # one loop: a record per model call
        wall = time.perf_counter() - t0
    finally:
        backend.cfg = saved
    records = read_jsonl(run_dir / "records.jsonl")
    requested = sum(r["prompt_tokens"] for r in records)
    computed = requested - sum(r["cached_prompt_tokens"] or 0 for r in records)
    return {"samples": len(records), "wall_s": wall, "generate_s": timed.seconds,
            "overhead_share": (wall - timed.seconds) / wall, "samples_per_s": len(records) / wall,
            "prefill_requested": requested, "prefill_computed": computed, "prefill_ratio": computed / requested,
            "completion_tokens": sum(r["completion_tokens"] for r in records), "records": records}
