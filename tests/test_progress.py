"""The run's bar moves per sample a backend reports, and by the rest when its call returns."""
from __future__ import annotations

import pytest

from harness import progress


def test_reported_samples_move_the_bar_as_they_finish_and_the_rest_at_the_end():
    moves: list[int] = []
    with progress.reporting(moves.append, 5):
        progress.advance()
        progress.advance(2)
        assert moves == [1, 2]
    assert moves == [1, 2, 2]
    progress.advance()  # outside a call: nowhere to report, no error
    assert moves == [1, 2, 2]


def test_a_backend_that_reports_nothing_moves_the_bar_once_per_call():
    moves: list[int] = []
    with progress.reporting(moves.append, 3):
        pass
    assert moves == [3]


def test_a_failed_call_moves_nothing_more():
    moves: list[int] = []
    with pytest.raises(ValueError), progress.reporting(moves.append, 3):
        progress.advance()
        raise ValueError
    assert moves == [1]
