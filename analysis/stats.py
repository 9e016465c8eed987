"""Proportions with Wilson score intervals (scipy's implementation)."""
from __future__ import annotations

import math

from scipy.stats import binomtest


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(rate, low, high); NaNs when n is 0."""
    if n == 0:
        return math.nan, math.nan, math.nan
    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return successes / n, ci.low, ci.high
