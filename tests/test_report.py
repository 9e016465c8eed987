"""Loading (typed, cached), the figures and the report of several scripted runs side by side."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from analysis import figures, report, tables
from analysis.load import CACHE_NAME, load_records, load_run
from tests.test_regress import scripted_run

SMALL = ["scenario.calls_made=[2,3,4]", "scenario.placement=[early]", "scenario.episodes_per_cell=4",
         "experiment.replicates=2"]


def _usage(grows: bool):
    """Scripted token counts: thinking grows with the episode index (a longer context) in the `none`
    arm of the thinking model and stays flat with the status bar."""
    def extra(sample, i: int) -> dict:
        prompt = 800 + 100 * i
        thinking = (prompt // 10 if sample.condition == "none" else 40) if grows else 0
        row = {"usage": {"prompt_tokens": prompt, "completion_tokens": thinking + 20, "thinking_tokens": thinking,
                         "answer_tokens": 20}}
        if i == 5 and sample.condition == "status_tail" and sample.request.replicate == 1:
            row["episode_id"] = "no-such-episode"  # unmatched line: the backend reports an error record
        return row
    return extra


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("report")
    small = scripted_run(root, "small", lambda c, i: i % 4 == 0, SMALL, _usage(False))
    thinker = scripted_run(root, "thinker", lambda c, i: c == "none" and i % 3 == 0, [*SMALL, "model=qwen3-0.6b"],
                           _usage(True))
    # the `cost_usd` field another part of statusbench adds to records: present in one run, absent in the other
    lines = [json.loads(x) for x in (thinker / "records.jsonl").read_text().splitlines()]
    (thinker / "records.jsonl").write_text("".join(json.dumps({**r, "cost_usd": 0.002}) + "\n" for r in lines))
    return [small, thinker]


def test_load_is_typed_and_flags_scripted_and_errors(runs):
    df = load_records(runs)
    assert len(df) == 2 * 12 * 2 * 2
    assert df["correct"].dtype == bool and df["thinking_tokens"].dtype == float and df["replicate"].dtype == np.int64
    assert df["scripted"].all()
    assert set(df["run_label"]) == {"small", "thinker"} and set(df["model"]) == {"smollm2-135m", "qwen3-0.6b"}
    errors = df[df["label"] == "error"]
    assert len(errors) == 2 and errors["error"].str.startswith("scripted: no completion").all()
    assert not errors["correct"].any()
    assert df.loc[df["run_label"] == "small", "cost_usd"].isna().all()
    assert (df.loc[df["run_label"] == "thinker", "cost_usd"] == 0.002).all()
    assert df["params.calls_made"].dtype == np.int64


def test_parquet_cache_is_used_and_rebuilt_when_the_jsonl_grows(tmp_path, runs):
    run = tmp_path / "copy"
    run.mkdir()
    lines = (runs[0] / "records.jsonl").read_text().splitlines()
    (run / "records.jsonl").write_text("\n".join(lines[:10]) + "\n")
    assert len(load_run(run)) == 10 and (run / CACHE_NAME).exists()
    cached = (run / CACHE_NAME).stat().st_mtime_ns
    assert len(load_run(run)) == 10 and (run / CACHE_NAME).stat().st_mtime_ns == cached  # served from the cache
    with open(run / "records.jsonl", "a") as fh:
        fh.write(lines[10] + "\n")
    assert len(load_run(run)) == 11  # the grown JSONL wins over the stale cache
    assert len(load_run(run, cache=False)) == 11


def test_load_names_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no records.jsonl"):
        load_records([tmp_path])
    (tmp_path / "records.jsonl").write_text('{"foo": 1}\n')
    with pytest.raises(ValueError, match=r"records.jsonl line 1 lacks field 'sample_id'"):
        load_records([tmp_path])


def test_figures_draw_the_numbers_of_the_tables(runs):
    df = load_records(runs)
    fig = figures.accuracy(df)
    heights = sorted(round(p.get_height(), 6) for p in fig.axes[0].patches)
    # balanced accuracy (the mean of limit-cell and control-cell accuracy) by hand, 12 episodes x 2 replicates:
    # episodes 0-3 are control cells, 4-11 limit cells; small answers wrongly on 0, 4, 8 in both arms, thinker on
    # 0, 3, 6, 9 in none only; one status_tail sample of each run is an error (episode 5, replicate 1)
    assert heights == [round(x, 6) for x in ((4 / 8 + 12 / 16) / 2, (6 / 8 + 11 / 16) / 2, (6 / 8 + 12 / 16) / 2,
                                             (8 / 8 + 15 / 16) / 2)]
    fig = figures.thinking_vs_context(df)
    legend = " ".join(t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
    # thinking = prompt / 10 in the `none` arm of the thinking model: 100 per 1k prompt tokens; flat with the bar
    assert "none: 100 [100, 100]" in legend and "status_tail: 0 [0, 0]" in legend
    # the small model never thinks: its thinking panel says what the table says, not a flat slope 0 [0, 0]
    small = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("smollm2-135m\nthinking"))
    assert [t.get_text() for t in small.get_legend().get_texts()][:2] == ["none: not measured (no thinking)",
                                                                           "status_tail: not measured (no thinking)"]


def test_report_of_two_runs_side_by_side(runs, tmp_path):
    out = tmp_path / "report"
    assert report.main([str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    for heading in ("Runs side by side", "By condition", "Paired comparison with the baseline condition",
                    "pass^k over replicates", "Thinking tokens", "Cost and latency per iteration", "Errors by kind",
                    "By cell of the scenario grid", "Outcomes"):
        assert f"## {heading}\n" in md, heading
    assert "96 scripted (replayed, not generated)" in md
    assert md.split("\n## ")[1].startswith("Finding\n\n**small.** On balanced accuracy")  # the finding in words comes first
    assert "| scripted" in md  # the error kind
    assert "pass^2" in md
    grader = md.split("## The grader's measured agreement\n")[1].split("\n## ")[0]  # a call-limit family: its error rate
    assert "Cohen's kappa" in grader and "| hand \\ grader |" in grader
    side = md.split("## Runs side by side")[1].split("##")[0]
    assert "small" in side and "thinker" in side
    for name in figures.FIGURES:
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").read_bytes().startswith(b"%PDF")
        assert f"![Figure: {name.replace('_', ' ')}]({name}.png)" in md
    html = (out / "report.html").read_text()
    sources = re.findall(r'<img src="([^"]*)"', html)
    assert len(sources) == len(figures.FIGURES) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<table>" in html


def test_cost_per_correct_in_dollars_only_where_recorded(runs):
    cl = tables.cost_latency(load_records(runs)).set_index(["run_label", "condition"])
    assert cl.loc[("small", "none"), "usd_per_correct"] != cl.loc[("small", "none"), "usd_per_correct"]  # NaN
    t = cl.loc[("thinker", "none")]
    assert t["usd_per_correct"] == pytest.approx(0.002 * t["n"] / t["correct"])


def test_report_cli_errors_and_single_run_default(runs, tmp_path, capsys):
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "no records.jsonl" in capsys.readouterr().err
    assert report.default_out([runs[0]]) == runs[0]
    assert report.default_out(runs) == runs[0].parent.resolve() / "report"


def test_a_section_renders_under_its_heading(runs):
    from analysis.section import Section

    df = load_records(runs)
    part = Section("Attention", f"{len(df)} records from {len(runs)} runs")
    assert "## Attention\n\n96 records from 2 runs" in report.to_markdown(df, runs, [part])


def test_report_survives_a_run_that_cannot_be_paired(runs, tmp_path):
    # the same episodes redone with other settings into one directory: no pairing, but a report
    run = tmp_path / "mixed"
    run.mkdir()
    lines = [json.loads(x) for x in (runs[0] / "records.jsonl").read_text().splitlines()]
    redo = [{**r, "sample_id": r["sample_id"] + "-redo"} for r in lines[:4]]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines + redo))
    md = report.write_report([run])
    assert "Not computed: the first arm holds" in md and "give each configuration its own run.name" in md
    assert (run / "report.html").exists()


def test_find_runs_counts_a_sharded_run_once(tmp_path, monkeypatch):
    from analysis.load import runs_from_env
    from harness.rundir.layout import find_runs

    for d in ("exp/plain", "exp/sharded/shards/0-of-2", "exp/sharded/shards/1-of-2"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "records.jsonl").write_text("")
    assert find_runs(tmp_path) == [tmp_path / "exp/plain", tmp_path / "exp/sharded"]
    monkeypatch.setenv("STATUSBENCH_RUNS", f"/a{os.pathsep}/b")
    assert runs_from_env(tmp_path) == [Path("/a"), Path("/b")]


def test_unknown_token_counts_are_shown_as_unknown_not_zero(runs):
    df = load_records(runs[:1])
    df[["prompt_tokens", "completion_tokens", "thinking_tokens", "answer_tokens"]] = np.nan  # e.g. scripted, no usage
    cl = tables.cost_latency(df)
    assert cl["tokens_per_correct"].isna().all() and not cl["token_counts"].any()
    assert figures.thinking_vs_context(df) == "No token counts in these records (e.g. scripted replays without `usage` or a tokenizer)."
    parts = {s.title: s for s in report.sections(df)}
    assert "No token counts in these records" in parts["Thinking tokens"].text
    assert set(parts["Thinking tokens"].table["median [95% CI]"]) == {"–"}
    assert set(parts["Cost and latency per iteration"].table["tokens / correct"]) == {"–"}
    # one record without counts makes its group's total unknown
    partial = load_records(runs[:1])
    partial.loc[partial.index[0], "prompt_tokens"] = np.nan
    cl = tables.cost_latency(partial).set_index("condition")
    assert np.isnan(cl.loc[partial.loc[partial.index[0], "condition"], "tokens_per_correct"])
