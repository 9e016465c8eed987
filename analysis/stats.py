"""The statistics, on plain arrays: scipy and statsmodels do the work, this module fixes the choices.

- proportions: Wilson score intervals (small n and rates near 0 or 1 are the norm here);
- balanced accuracy: the mean of the per-class (limit cells, control cells) accuracies;
- two arms on the same episodes: exact McNemar on the discordant pairs, and the accuracy difference
  with a bootstrap interval that resamples whole episodes (replicates of one episode are not
  independent, so resampling samples would understate the width);
- pass^k: the chance that k replicates of one episode all succeed (tau-bench's estimator);
- location of token counts: bootstrap intervals of the median and the mean;
- growth: the OLS slope of thinking tokens against prompt tokens with its t interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from scipy.special import comb

BOOTSTRAP_RESAMPLES = 2000


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(rate, low, high); NaNs when n is 0."""
    if n == 0:
        return math.nan, math.nan, math.nan
    ci = sps.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return successes / n, ci.low, ci.high


def balanced(*classes: tuple[float, float, float]) -> tuple[float, float, float]:
    """Mean of per-class accuracies (rate, low, high), classes with no samples (NaN) left out. The
    interval combines the classes' half-widths in quadrature (the classes are independent samples),
    clipped to [0, 1]: an approximation, reported as such."""
    present = [c for c in classes if not math.isnan(c[0])]
    if not present:
        return math.nan, math.nan, math.nan
    k = len(present)
    est = sum(c[0] for c in present) / k
    down = math.sqrt(sum((c[0] - c[1]) ** 2 for c in present)) / k
    up = math.sqrt(sum((c[2] - c[0]) ** 2 for c in present)) / k
    return est, max(0.0, est - down), min(1.0, est + up)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (A right & B wrong, A wrong & B right)."""
    from statsmodels.stats.contingency_tables import mcnemar

    if only_a + only_b == 0:
        return 1.0
    return float(mcnemar([[0, only_a], [only_b, 0]], exact=True).pvalue)


def mcnemar_drop(only_a: int, only_b: int) -> float:
    """One-sided exact McNemar p-value for "B is worse than A": P(X >= only_a), X ~ Bin(discordant, 1/2)."""
    if only_a + only_b == 0:
        return 1.0
    return float(sps.binomtest(only_a, only_a + only_b, 0.5, alternative="greater").pvalue)


def cluster_bootstrap_diff(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, confidence: float = 0.95,
                           n_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """mean(b) - mean(a) over paired samples, with a percentile bootstrap interval over clusters.

    a, b: outcomes (0/1 or numbers) of the two arms on the same samples; clusters: the episode of
    each pair. Whole clusters are resampled with replacement.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    codes, inverse = np.unique(np.asarray(clusters), return_inverse=True)
    diff = float(b.mean() - a.mean())
    if len(codes) < 2:
        return diff, math.nan, math.nan
    sum_d = np.bincount(inverse, weights=b - a)  # per-cluster sums keep unequal cluster sizes right
    size = np.bincount(inverse).astype(float)

    def statistic(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        idx = idx.astype(int)
        return sum_d[idx].sum(axis=axis) / size[idx].sum(axis=axis)

    if np.ptp(sum_d / size) == 0:  # every cluster says the same: no spread to resample
        return diff, diff, diff
    res = sps.bootstrap((np.arange(len(codes)),), statistic, vectorized=True, n_resamples=n_resamples,
                        confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    return diff, float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class Paired:
    """Two arms on the same samples: accuracy of each, the discordant pairs, tests and the difference."""

    n: int
    acc_a: float
    acc_b: float
    only_a: int  # A right, B wrong
    only_b: int  # A wrong, B right
    p_two_sided: float
    p_drop: float  # one-sided: B worse than A
    diff: float  # acc_b - acc_a
    diff_low: float
    diff_high: float


def paired(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, confidence: float = 0.95, seed: int = 0) -> Paired:
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if len(a) != len(b) or len(a) != len(clusters):
        raise ValueError(f"paired arms need equal lengths, got {len(a)}, {len(b)}, {len(clusters)} clusters")
    if len(a) == 0:
        return Paired(0, *[math.nan] * 2, 0, 0, 1.0, 1.0, *[math.nan] * 3)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    diff, low, high = cluster_bootstrap_diff(a, b, clusters, confidence=confidence, seed=seed)
    return Paired(len(a), float(a.mean()), float(b.mean()), only_a, only_b, mcnemar_exact(only_a, only_b),
                  mcnemar_drop(only_a, only_b), diff, low, high)


def pass_hat_k(successes: np.ndarray, trials: np.ndarray, k: int) -> float:
    """Mean over episodes of C(c, k) / C(n, k): the chance that k replicates drawn without replacement
    all succeed. NaN when an episode has fewer than k replicates."""
    c, n = np.asarray(successes), np.asarray(trials)
    if len(n) == 0 or k < 1 or (n < k).any():
        return math.nan
    return float(np.mean(comb(c, k, exact=False) / comb(n, k, exact=False)))


def bootstrap_location(values: np.ndarray, statistic: str, *, confidence: float = 0.95,
                       n_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high) of the median or mean with a percentile bootstrap interval; NaN values dropped."""
    fn = {"median": np.median, "mean": np.mean}[statistic]
    x = np.asarray(values, float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    est = float(fn(x))
    if len(x) == 1 or np.ptp(x) == 0:
        return est, est, est
    res = sps.bootstrap((x,), fn, vectorized=True, n_resamples=n_resamples, confidence_level=confidence,
                        method="percentile", rng=np.random.default_rng(seed))
    return est, float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class Slope:
    slope: float
    low: float
    high: float
    intercept: float
    p_value: float
    n: int


def ols_slope(x: np.ndarray, y: np.ndarray, *, confidence: float = 0.95) -> Slope:
    """OLS of y on x (with intercept): the slope, its t interval and p-value. NaN when x does not vary."""
    import statsmodels.api as sm

    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(x) < 3 or np.ptp(x) == 0:
        return Slope(math.nan, math.nan, math.nan, math.nan, math.nan, int(len(x)))
    fit = sm.OLS(y, sm.add_constant(x)).fit()
    low, high = fit.conf_int(alpha=1 - confidence)[1]
    p = float(fit.pvalues[1]) if np.isfinite(fit.pvalues[1]) else 1.0  # a perfect flat fit has no error
    return Slope(float(fit.params[1]), float(low), float(high), float(fit.params[0]), p, int(len(x)))
