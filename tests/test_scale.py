"""The bench's analysis-at-scale measure: synthetic runs whose records pair one to one, report and
regress run on them in child processes, with their time and peak memory and growth."""
from __future__ import annotations

import json

from harness.tools import bench, scale


def test_report_and_regress_over_synthetic_runs_of_two_sizes(tmp_path):
    result = bench.scale_result(["scenario.calls_made=[3]", "scenario.episodes_per_cell=1"], sizes=(16, 64))["scale"]
    for n in (16, 64):
        for cmd in ("report", "regress"):
            run = result[str(n)][cmd]
            assert run["exit"] == 0, run["stderr_tail"]  # regress: identical runs, no drop
            assert run["wall_s"] > 0 and run["peak_rss_mb"] > 50  # the child's own RSS: python with pandas
    assert set(result["growth"]) == {"report", "regress"}
    [report_row, regress_row] = scale.rows(result)
    assert report_row[0] == "analysis.report: 16 / 64 records" and "MB" in report_row[1]


def test_synthetic_records_pair_one_to_one_across_cycles(tmp_path):
    template = [{"sample_id": "a", "episode_id": "e1", "condition": "none", "replicate": 0},
                {"sample_id": "b", "episode_id": "e1", "condition": "status_tail", "replicate": 0}]
    (tmp_path / "prompts.jsonl").write_text("")
    run = scale.synthetic_run(template, tmp_path / "prompts.jsonl", tmp_path / "run", 5)
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and len({r["sample_id"] for r in rows}) == 5
    keys = [(r["episode_id"], r["condition"], r["replicate"]) for r in rows]
    assert len(set(keys)) == 5 and keys[2] == ("e1-1", "none", 0)
