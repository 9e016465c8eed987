"""run.shard=i/n: a deterministic split of the plan by episode, one writer lock per shard, merged by the report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.backends import Backend
from harness.errors import ConfigError
from harness.run import first_steps
from harness.run import execute
from harness.rundir.store import RunStore
from tests.conftest import make_cfg, run_cli

GRID = ["scenario.calls_made=[2,3,4]", "scenario.episodes_per_cell=3", "experiment.replicates=2"]


def _scripted(tmp_path: Path, *overrides: str):
    completions = tmp_path / "completions.jsonl"
    if not completions.exists():
        plan = first_steps(make_cfg("backend=scripted", f"backend.path={__file__}", *GRID))
        completions.write_text("".join(json.dumps({"episode_id": s.episode.id, "condition": s.condition,
                                                   "replicate": s.request.replicate, "text": "No."}) + "\n" for s in plan))
    return make_cfg("backend=scripted", f"backend.path={completions}", "run.progress=false", *GRID, *overrides)


def test_shards_partition_the_plan_by_episode(tmp_path: Path):
    full = first_steps(_scripted(tmp_path))
    shards = [first_steps(_scripted(tmp_path, f"run.shard={i}/3")) for i in range(3)]
    ids = [s.sample_id for shard in shards for s in shard]
    assert sorted(ids) == sorted(s.sample_id for s in full)  # every sample exactly once
    assert all(shards)  # 36 episodes do not all hash to one shard
    owner = {s.request.episode_id: i for i, shard in enumerate(shards) for s in shard}
    assert all(owner[s.request.episode_id] == i for i, shard in enumerate(shards) for s in shard)  # arms, replicates together
    # plan positions are the whole plan's (order-matched scripted replay), and the split is stable
    assert {s.request.index: s.sample_id for shard in shards for s in shard} == {s.request.index: s.sample_id for s in full}
    assert [s.sample_id for s in first_steps(_scripted(tmp_path, "run.shard=1/3"))] == [s.sample_id for s in shards[1]]


@pytest.mark.parametrize("bad", ["3/3", "a/2", "1", "-1/2"])
def test_a_bad_shard_names_the_key(tmp_path: Path, bad: str):
    with pytest.raises(ConfigError, match="run.shard: must be i/n"):
        _scripted(tmp_path, f"run.shard={bad}")


def test_shards_write_apart_and_the_report_merges_them(tmp_path: Path):
    from analysis.load import load_records
    from analysis.report import write_report

    run_dir = tmp_path / "run"
    total = len(first_steps(_scripted(tmp_path)))
    # shard 0's writer is still open while shard 1 runs: separate directories, separate locks
    with RunStore(run_dir / "shards" / "0-of-2"):
        assert execute(_scripted(tmp_path, "run.shard=1/2"), {}, run_dir)["new"] > 0
    assert execute(_scripted(tmp_path, "run.shard=0/2"), {}, run_dir)["new"] > 0
    assert not (run_dir / "records.jsonl").exists()
    df = load_records([run_dir])
    assert len(df) == total and df["sample_id"].is_unique and set(df["run"]) == {str(run_dir)}
    write_report([run_dir])
    assert (run_dir / "report.md").exists()
    # a rerun of a shard finds its samples done
    assert execute(_scripted(tmp_path, "run.shard=0/2"), {}, run_dir)["new"] == 0


def test_the_cli_takes_a_shard(tmp_path: Path):
    cfg = _scripted(tmp_path)  # writes the completions file
    res = run_cli("backend=scripted", f"backend.path={cfg.backend.path}", *GRID, f"run.root={tmp_path}",
                  "run.name=cli", "run.shard=1/2", "run.report=false")
    assert res.returncode == 0, res.stderr
    lines = (tmp_path / "status_ablation" / "cli" / "shards" / "1-of-2" / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(first_steps(_scripted(tmp_path, "run.shard=1/2")))


class _Backend(Backend):
    """Answers every request, or fails every one (an outage), like a remote server would."""

    name = "stub"

    def __init__(self, fail: bool):
        self.fail, self.calls = fail, 0

    def describe(self) -> dict:
        return {}

    def generate(self, requests):
        from harness.types import Completion

        self.calls += len(requests)
        return [Completion(error="openai: http 503: overloaded") if self.fail else Completion(text="No.", finish_reason="stop")
                for _ in requests]


def test_a_plain_retry_after_sharded_failures_reports_the_retried_answers(tmp_path: Path):
    from analysis.load import load_records

    run_dir = tmp_path / "run"
    total = len(first_steps(_scripted(tmp_path)))
    for i in range(2):
        execute(_scripted(tmp_path, f"run.shard={i}/2"), {}, run_dir, backend=_Backend(fail=True))
    assert set(load_records([run_dir])["label"]) == {"error"}
    # without retry_errors the shards' records are the run's: nothing to do
    idle = _Backend(fail=False)
    assert execute(_scripted(tmp_path), {}, run_dir, backend=idle)["new"] == 0 and idle.calls == 0
    retry = _Backend(fail=False)
    assert execute(_scripted(tmp_path, "run.retry_errors=true"), {}, run_dir, backend=retry)["new"] == total == retry.calls
    df = load_records([run_dir])  # the parent's newer answers win over the shards' older errors
    assert len(df) == total and df["sample_id"].is_unique and "error" not in set(df["label"])
    # a retry inside a shard after that sees the whole run as done
    again = _Backend(fail=False)
    assert execute(_scripted(tmp_path, "run.shard=0/2", "run.retry_errors=true"), {}, run_dir, backend=again)["new"] == 0


def test_newest_record_wins_by_time_not_position():
    import pandas as pd

    from analysis.load import newest
    from harness.rundir.store import newest as newest_rows

    rows = [{"sample_id": "a", "label": "refused", "created_at": "2026-01-01T00:00:02.500000+00:00"},
            {"sample_id": "b", "label": "refused", "created_at": "2026-01-01T00:00:01+00:00"},
            {"sample_id": "a", "label": "error", "created_at": "2026-01-01T00:00:02+00:00"},  # older, later in the file
            {"sample_id": "b", "label": "violated", "created_at": "2026-01-01T00:00:01+00:00"}]  # a tie: the later row
    assert {k: r["label"] for k, r in newest_rows(rows).items()} == {"a": "refused", "b": "violated"}
    df = newest(pd.DataFrame(rows))
    assert df[["sample_id", "label"]].values.tolist() == [["a", "refused"], ["b", "violated"]]
