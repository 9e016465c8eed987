"""Figures a reader can read: labels that do not overlap, the n at a bar's foot that is the rate's
denominator, no empty chart standing for "no data", no matplotlib warning."""
from __future__ import annotations

import warnings
from itertools import combinations
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.load import load_records
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
    legend = next(ax.get_legend() for ax in fig.axes if ax.get_legend())
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
