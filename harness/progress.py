"""Progress from inside a backend call: a backend reports samples as they finish (`advance`), or
fractions of the call's samples as it computes (`Work`), and the run's bar moves then; whatever a
backend does not report advances when its call returns."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

_sink: ContextVar[Callable[[float], None] | None] = ContextVar("statusbench_progress", default=None)


def advance(n: float = 1) -> None:
    """`n` more samples of the current call are finished (a fraction: that much of their work)."""
    sink = _sink.get()
    if sink is not None:
        sink(n)


class Work:
    """A call's `samples` spread over its `units` of work (tokens to prefill, tokens to decode):
    each `done(k)` advances the bar by k units' share, so the bar moves per prefill chunk and decode
    step, and its ETA is the remaining work at the rate work is being done."""

    def __init__(self, samples: int, units: int):
        self.per_unit = samples / units if units else 0.0

    def done(self, units: int) -> None:
        if units:
            advance(units * self.per_unit)


class Reported:
    def __init__(self, update: Callable[[float], None], total: int):
        self.update, self.total, self.count = update, total, 0.0

    def __call__(self, n: float) -> None:
        n = min(n, self.total - self.count)  # float shares never carry the bar past the call's samples
        if n > 0:
            self.count += n
            self.update(n)


@contextmanager
def reporting(update: Callable[[float], None], total: int) -> Iterator[Reported]:
    """Route `advance` to `update` during a call of `total` samples; on exit, advance the rest
    (a backend that reports nothing moves the bar once per call, as before)."""
    reported = Reported(update, total)
    token = _sink.set(reported)
    try:
        yield reported
    finally:
        _sink.reset(token)
    if total - reported.count > 1e-6:  # not float dust: the shares of a call's work sum to its samples
        update(total - reported.count)
