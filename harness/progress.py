"""Progress from inside a backend call: a backend reports samples as they finish (`advance`), the
run's bar moves then; whatever a backend does not report advances when its call returns."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

_sink: ContextVar[Callable[[int], None] | None] = ContextVar("statusbench_progress", default=None)


def advance(n: int = 1) -> None:
    """`n` more samples of the current call are finished."""
    sink = _sink.get()
    if sink is not None:
        sink(n)


class Reported:
    def __init__(self, update: Callable[[int], None]):
        self.update, self.count = update, 0

    def __call__(self, n: int) -> None:
        self.count += n
        self.update(n)


@contextmanager
def reporting(update: Callable[[int], None], total: int) -> Iterator[Reported]:
    """Route `advance` to `update` during a call of `total` samples; on exit, advance the rest
    (a backend that reports nothing moves the bar once per call, as before)."""
    reported = Reported(update)
    token = _sink.set(reported)
    try:
        yield reported
    finally:
        _sink.reset(token)
    if total > reported.count:
        update(total - reported.count)
