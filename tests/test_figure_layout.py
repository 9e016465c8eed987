"""Figures a reader can read: labels that do not overlap, the n at a bar's foot that is the rate's
denominator, no empty chart standing for "no data", no matplotlib warning."""
from __future__ import annotations

import json
import math
import warnings
from itertools import combinations
from pathlib import Path
from unittest.mock import patch

import pandas as pd
import pytest

from analysis import figures, propensity, report
from analysis.load import load_records
from tests.test_regress import scripted_run
from tests.test_report import _usage
from tests.test_report_args import fake_run

CELLS = [{"calls_made": k, "placement": p} for k in (0, 1, 2, 3, 4, 5) for p in ("early", "interleaved", "late")]


def _overlaps(texts) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent()) for t in texts if t.get_text()]
    return [(a, b) for (a, ba), (b, bb) in combinations(boxes, 2) if ba.overlaps(bb)]


def _drawn(fig):
    fig.canvas.draw()  # Figure without pyplot gets an Agg canvas on demand
    return fig


def test_many_cells_have_readable_x_labels_and_feet_that_are_denominators(tmp_path: Path):
    df = load_records([fake_run(tmp_path / "r", ("none", "status_tail"), params=CELLS, label="refused")])
    df.loc[df.index[-1], "label"] = "error"  # one limit sample is no answer: out of the violation rate's n
    fig = _drawn(figures.control_vs_limit(df))
    control, limit = fig.axes[0], fig.axes[1]
    for ax in (control, limit):
        assert not _overlaps(ax.get_xticklabels())
    feet = sorted(int(t.get_text()) for t in limit.texts if t.get_text().isdigit())
    assert feet.count(0) == 1 and set(feet) == {0, 1}  # the error sample's arm: its cell's denominator is 0


def test_n_a_is_not_printed_over_the_n(tmp_path: Path):
    df = load_records([fake_run(tmp_path / "r", ("none",), params=[{"calls_made": 3}])])
    df["label"] = "error"  # samples, but no answer: the rate is n/a
    fig = _drawn(figures.control_vs_limit(df))
    texts = [t for t in fig.axes[1].texts if t.get_text() in ("n/a", "0")]
    assert sorted(t.get_text() for t in texts) == ["0", "n/a"] and not _overlaps(texts)


def test_an_empty_panel_leaves_no_legend_warning(tmp_path: Path):
    df = load_records([fake_run(tmp_path / "r", ("none", "status_tail"), params=[{"calls_made": 0}, {"calls_made": 1}])])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = _drawn(figures.control_vs_limit(df))  # only control cells: the limit panel is empty
    assert not [w for w in caught if "legend" in str(w.message)], [str(w.message) for w in caught]
    legend = fig.legends[0]  # one, below the panels
    assert [t.get_text() for t in legend.get_texts()] == ["none", "status_tail"]


def test_cost_per_correct_says_when_nothing_is_known(tmp_path: Path):
    df = load_records([fake_run(tmp_path / "r", ("none", "status_tail"))])
    df[["prompt_tokens", "completion_tokens"]] = float("nan")
    said = figures.cost_per_correct(df)
    assert isinstance(said, str) and said.startswith("No cost known per correct answer")
    df["prompt_tokens"], df["completion_tokens"] = 10.0, 2.0
    assert not isinstance(figures.cost_per_correct(df), str)


def test_the_outcomes_caption_names_every_label():
    caption = figures.outcomes.__doc__.split("\n\n")[0]
    assert all(label in caption for label in pd.Index(["violated", "complied", "refused", "other", "truncated", "error"]))


def _drawn_overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of texts the figure draws (titles, labels, tick labels, legend entries, annotations) whose
    boxes overlap: each Text is caught as it draws, so ticks outside the axes' range, which are not
    drawn, do not count."""
    from matplotlib.text import Text

    boxes, draw = [], Text.draw

    def record(self, renderer):
        if self.get_visible() and self.get_text().strip():
            boxes.append((self.get_text(), self.get_window_extent(renderer)))
        return draw(self, renderer)

    with patch.object(Text, "draw", record):
        fig.draw_without_rendering()
    return [(a, b) for (a, ba), (b, bb) in combinations(boxes, 2) if ba.overlaps(bb)]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> list[Path]:
    """Two runs of one sweep as a multirun lays them out: the same thinking model under two settings
    (so the figures name runs by their long labels), a 6 x 3 grid, propensity scores in the records."""
    root = tmp_path_factory.mktemp("sweep")
    grid = ["scenario.calls_made=[0,1,2,3,4,5]", "scenario.placement=[early,interleaved,late]", "scenario.episodes_per_cell=2",
            "model=qwen3-0.6b"]
    runs = [scripted_run(root, f"qwen3-0.6b-hf-xfinity-max_new_tokens-{m}", lambda c, i: c == "none" and i % 3 == 0,
                         [*grid, f"model.generation.max_new_tokens={m}"], _usage(True)) for m in (512, 2048)]
    for run in runs:
        lines = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
        (run / "records.jsonl").write_text("".join(json.dumps({**r, "propensity": {
            "violate_logprob": math.log(0.6 if r["condition"] == "none" else 0.35 + 0.01 * (k % 7)),
            "tool_call_logprob": math.log(0.9)}}) + "\n" for k, r in enumerate(lines)))
    return runs


def test_the_merged_figures_of_a_sweep_draw_no_text_over_text_and_warn_nothing(sweep, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report.write_report(sweep, tmp_path)
        df = load_records(sweep)
        drawn = {name: fn(df) for name, fn in figures.FIGURES.items()}
        drawn[propensity.FIGURE] = propensity.figure(propensity.paired_log_odds(propensity.episode_scores(df)))
        overlaps = {name: _drawn_overlaps(fig) for name, fig in drawn.items()}
    assert not caught, [str(w.message) for w in caught]
    assert (tmp_path / f"{propensity.FIGURE}.png").is_file() and all((tmp_path / f"{n}.png").is_file() for n in figures.FIGURES)
    assert not any(overlaps.values()), {n: o for n, o in overlaps.items() if o}
