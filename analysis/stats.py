"""The statistics, on plain arrays: scipy and statsmodels do the work, this module fixes the choices.

The episode is the unit of evidence. Replicates of one episode share its prompt, so they are not
independent draws: every interval and test here takes each sample's episode and works over episodes.
Every interval below was checked for its coverage (or its test for its level) by `analysis.simulate`
on runs whose truth was built, at 4 to 32 episodes (tests/test_inference_sim.py).

- proportions: Korn-Graubard intervals (Clopper-Pearson on the effective sample size: the samples
  divided by the design effect the episodes show, with episodes - 1 degrees of freedom);
- balanced accuracy: the mean of the per-class (limit cells, control cells) accuracies;
- means of bounded episode-level values (a paired accuracy difference in [-1, 1], pass^k in [0, 1],
  violations per step): Gaffke's bound (`bounded_mean`), which cannot leave the range, is never
  zero-width, and needs no assumption past the range: at 4 episodes that all say +1 it gives
  [-0.2, +1], since a mean below -0.2 makes four +1 in a row rarer than 1 in 40;
- means of other values (thinking tokens, attention shares): a bootstrap-t interval over
  episodes (`mean_interval`), clipped to what is possible, and no interval at all (NaN) when every
  episode shows the same value. No interval covers the mean of a long-tailed value at a few
  episodes: `analysis.simulate` measures how near this one comes;
- two arms on the same episodes: the per-episode difference, with an exact sign-flip permutation
  test over episodes (Monte Carlo above EXACT_EPISODES episodes); where the difference has no two
  known bounds (a shift in log-odds), the interval that inverts that test (`shift_interval`: subset
  means, exact where the differences are symmetric, none below 6 episodes, where no exact 95% exists);
- pass^k: the chance that k replicates of one episode all succeed (tau-bench's estimator).

The slope of thinking against context, censored where a sample was cut, is `analysis.slopes`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.special import comb

BOOTSTRAP_RESAMPLES = 2000
MIN_BOOTSTRAP_EPISODES = 4  # below: t intervals; the bootstrap-t needs resamples that differ
EXACT_EPISODES = 16  # sign-flip tests enumerate all 2^n flips up to here
MONTE_CARLO_FLIPS = 9999
BOUND_DRAWS = 1_000_000  # a Gaffke bound over n episodes draws BOUND_DRAWS / (n + 1) weightings (at least 1000): its
# Monte Carlo error about 0.003 whatever n (the spread of the mean shrinks as the weightings do)
NAN3 = (math.nan, math.nan, math.nan)
# how the report names each interval
BOUNDED_NOTE = ("Gaffke interval over episodes (it assumes nothing but the values' range, cannot leave it and is "
                "never zero-width)")
SHIFT_NOTE = ("exact interval over episodes that inverts the sign-flip test (Hartigan's subset means: it assumes "
              "each episode's difference symmetric about the shift, as the test does; – below 6 episodes, where no "
              "exact 95% interval exists, or where every episode shows the same difference)")
MEAN_NOTE = f"bootstrap-t interval over episodes (t below {MIN_BOOTSTRAP_EPISODES} episodes), clipped to the possible range"


@dataclass
class Estimate:
    """A point estimate with its interval and the number of episodes it rests on."""

    est: float
    low: float
    high: float
    episodes: int


def by_episode(values: np.ndarray, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-episode sums, per-episode sample counts), episodes in order of first appearance."""
    codes = pd.factorize(pd.Series(np.asarray(clusters)), sort=False)[0]
    return (np.bincount(codes, weights=np.asarray(values, float)), np.bincount(codes).astype(float))


def episode_means(values: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    sums, sizes = by_episode(values, clusters)
    return sums / sizes


def proportion(successes: np.ndarray, clusters: np.ndarray, confidence: float = 0.95) -> Estimate:
    """Share of successes (0/1 per sample) with a Korn-Graubard interval over the episodes: the
    design effect (the variance the episodes show over the binomial variance, at least 1) shrinks
    the sample size; an all-0 or all-1 group, where no variance shows, counts one sample per
    episode (as if replicates were copies). NaNs when there is no sample."""
    from statsmodels.stats.proportion import proportion_confint

    y = np.asarray(successes, float)
    n = len(y)
    if n == 0:
        return Estimate(*NAN3, 0)
    sums, sizes = by_episode(y, clusters)
    k, p = len(sums), float(y.mean())
    if 0 < p < 1 and k > 1:
        var = k / (k - 1) * np.sum((sums - p * sizes) ** 2) / n**2  # linearised variance of the ratio estimator
        n_eff = n / max(1.0, var / (p * (1 - p) / n))
    else:
        n_eff = float(k)
    if k > 1:  # episodes - 1 degrees of freedom: the t quantile in place of z
        alpha = 1 - confidence
        n_eff *= (sps.norm.ppf(1 - alpha / 2) / sps.t.ppf(1 - alpha / 2, k - 1)) ** 2
    low, high = proportion_confint(p * n_eff, n_eff, alpha=1 - confidence, method="beta")
    return Estimate(p, float(low), float(high), k)


def balanced(*classes: Estimate) -> Estimate:
    """Mean of per-class accuracies, classes with no samples (NaN) left out. The interval combines
    the classes' half-widths in quadrature (the classes are disjoint episodes), clipped to [0, 1]."""
    present = [c for c in classes if not math.isnan(c.est)]
    if not present:
        return Estimate(*NAN3, 0)
    k = len(present)
    est = sum(c.est for c in present) / k
    down = math.sqrt(sum((c.est - c.low) ** 2 for c in present)) / k
    up = math.sqrt(sum((c.high - c.est) ** 2 for c in present)) / k
    return Estimate(est, max(0.0, est - down), min(1.0, est + up), sum(c.episodes for c in present))


def bootstrap_t_bounds(x: np.ndarray, *, confidence: float = 0.95, n_resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Studentized (bootstrap-t) bounds on the mean of each row of x ([runs, episodes], no NaN, some
    spread): the episodes resampled, each resample's t statistic, its quantiles in place of Student's
    t's. It follows a skewed distribution (thinking counts, attention shares) where the t interval
    is too short on the long side; a resample with no spread gives an infinite t, kept as such."""
    x = np.atleast_2d(np.asarray(x, float))
    n = x.shape[1]
    mean, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    draws = x[:, np.random.default_rng(seed).integers(0, n, (n_resamples, n))]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (draws.mean(axis=2) - mean[:, None]) / (draws.std(axis=2, ddof=1) / math.sqrt(n))
    t = np.where(np.isnan(t), 0.0, t)  # a resample with no spread and the sample's own mean
    tail = (1 - confidence) / 2
    # the order statistics outward, not interpolated: between two infinite t's that would be NaN
    return (mean - np.quantile(t, 1 - tail, axis=1, method="higher") * se,
            mean - np.quantile(t, tail, axis=1, method="lower") * se)


def mean_interval(values: np.ndarray, *, within: tuple[float, float] = (-math.inf, math.inf), confidence: float = 0.95,
                  n_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Estimate:
    """Mean of one value per episode (NaNs dropped), for values without two known bounds: a bootstrap-t
    interval over episodes (a t interval below MIN_BOOTSTRAP_EPISODES, where too few resamples differ),
    clipped to `within` (what the value can be: a count is >= 0, a share in [0, 1]). No interval (NaN
    bounds) from one episode or when every episode shows the same value: no spread is seen, so none
    can be estimated. Values with two known bounds whose extremes occur (0/1 outcomes, pass^k) take
    `bounded_mean`."""
    x = np.asarray(values, float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Estimate(*NAN3, 0)
    est = float(x.mean())
    if len(x) == 1 or np.ptp(x) == 0:
        return Estimate(est, math.nan, math.nan, len(x))
    if len(x) < MIN_BOOTSTRAP_EPISODES:
        low, high = sps.ttest_1samp(x, 0.0).confidence_interval(confidence)
    else:
        low, high = (float(b[0]) for b in bootstrap_t_bounds(x, confidence=confidence, n_resamples=n_resamples, seed=seed))
    return Estimate(est, float(np.clip(low, *within)), float(np.clip(high, *within)), len(x))


def gaffke_bounds(x: np.ndarray, low: float, high: float, *, strata: np.ndarray | None = None, confidence: float = 0.95,
                  draws: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper confidence bounds for each row of x ([runs, episodes], no NaN) on the mean of
    values known to lie in [low, high]: Gaffke's bound, the quantiles of the sample mean reweighted by
    Dirichlet(1, ..., 1) weights over the episodes plus one more point at the bound on that side
    (Gaffke 2005; Learned-Miller & Thomas 2019). The extra point is what keeps the bound honest where
    the sample shows no spread. With `strata` (a code per column) the mean is the mean of the strata's
    means (balanced accuracy), each stratum reweighted on its own with its own extra point. `draws`
    weightings (default: BOUND_DRAWS / (episodes + 1), at least 1000)."""
    x = np.atleast_2d(np.asarray(x, float))
    codes = np.zeros(x.shape[1], int) if strata is None else pd.factorize(pd.Series(strata), sort=True)[0]
    k = codes.max() + 1
    draws = draws or max(1000, BOUND_DRAWS // (x.shape[1] + 1))
    tail = (1 - confidence) / 2
    bounds = np.empty((2, len(x)))
    for r, row in enumerate(x):
        rng = np.random.default_rng(seed)
        lows, highs = np.zeros(draws), np.zeros(draws)
        for s in range(k):
            # episodes of one value share one Gamma(count) weight: the same Dirichlet, drawn over the
            # few values 0/1 outcomes take instead of over every episode
            values, counts = np.unique(row[codes == s], return_counts=True)
            w = rng.standard_gamma(np.append(counts, 1.0), size=(draws, len(values) + 1))
            w /= w.sum(axis=1, keepdims=True)
            base = w[:, :-1] @ values
            lows += (base + low * w[:, -1]) / k
            highs += (base + high * w[:, -1]) / k
        bounds[:, r] = np.quantile(lows, tail), np.quantile(highs, 1 - tail)
    # a weighted mean of values in [low, high] stays there; the clip only removes rounding past it
    return np.clip(bounds[0], low, high), np.clip(bounds[1], low, high)


def bounded_mean(values: np.ndarray, low: float, high: float, *, strata: np.ndarray | None = None,
                 confidence: float = 0.95, seed: int = 0, draws: int | None = None) -> Estimate:
    """Mean of one value per episode, each known to lie in [low, high] (NaNs dropped), with Gaffke's
    bounds (`gaffke_bounds`); with `strata`, the mean of the strata's means. No interval from one episode."""
    x = np.asarray(values, float)
    keep = ~np.isnan(x)
    x, strata = x[keep], None if strata is None else np.asarray(strata)[keep]
    if len(x) == 0:
        return Estimate(*NAN3, 0)
    est = float(x.mean() if strata is None else pd.Series(x).groupby(strata).mean().mean())
    if len(x) == 1:
        return Estimate(est, math.nan, math.nan, 1)
    lo, hi = gaffke_bounds(x, low, high, strata=strata, confidence=confidence, seed=seed, draws=draws)
    return Estimate(est, float(lo[0]), float(hi[0]), len(x))


def sign_flip(d: np.ndarray, alternative: str = "two-sided", seed: int = 0, flips: int | None = None) -> float:
    """p-value of a mean per-episode difference under the null of no effect (each episode's
    difference as likely negative as positive): all 2^n sign flips up to EXACT_EPISODES episodes,
    `flips` (default MONTE_CARLO_FLIPS) random ones above."""
    d = np.asarray(d, float)
    d = d[~np.isnan(d)]
    if len(d) < 2 or not d.any():  # one episode is no test
        return 1.0
    res = sps.permutation_test((d,), np.mean, permutation_type="samples", alternative=alternative, vectorized=True,
                               n_resamples=2**EXACT_EPISODES if len(d) <= EXACT_EPISODES else flips or MONTE_CARLO_FLIPS,
                               rng=np.random.default_rng(seed))
    return float(res.pvalue)


def shift_interval(d: np.ndarray, *, confidence: float = 0.95, seed: int = 0, subsets: int | None = None) -> Estimate:
    """Mean per-episode difference of two arms on the same episodes (NaNs dropped), for differences
    without two known bounds (log-odds), with the interval that inverts the sign-flip test: the means of
    the 2^n - 1 non-empty subsets of the n episodes cut the line into 2^n pieces, each holding the true
    shift with chance 2^-n wherever the differences are symmetric about it (Hartigan 1969), as the test
    assumes; the interval runs from the k-th smallest to the k-th largest subset mean, k = the largest
    number with 2k / 2^n <= 1 - confidence. Every subset up to EXACT_EPISODES episodes, `subsets`
    (default MONTE_CARLO_FLIPS) random ones above (M + 1 in place of 2^n). No interval (NaN bounds)
    where k is 0, below 6 episodes at 95% (the smallest two-sided sign-flip p at 5 is 0.0625: no exact
    interval exists), or where every episode shows the same difference."""
    x = np.asarray(d, float)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return Estimate(*NAN3, 0)
    est = float(x.mean())
    if n <= EXACT_EPISODES:
        masks = (np.arange(1, 2**n)[:, None] >> np.arange(n)) & 1
    else:
        masks = np.random.default_rng(seed).integers(0, 2, (subsets or MONTE_CARLO_FLIPS, n))
        masks = masks[masks.any(axis=1)]
    k = math.floor((1 - confidence) / 2 * (len(masks) + 1) + 1e-9)
    if k == 0 or np.ptp(x) == 0:
        return Estimate(est, math.nan, math.nan, n)
    means = np.sort(masks @ x / masks.sum(axis=1))
    return Estimate(est, float(means[k - 1]), float(means[-k]), n)


def flip_method(episodes: int) -> str:
    return "exact" if episodes <= EXACT_EPISODES else f"Monte Carlo, {MONTE_CARLO_FLIPS} flips"


@dataclass
class Paired:
    """Two arms on the same samples: accuracy of each, the discordant pairs, and the per-episode
    difference (condition - baseline) with its interval and sign-flip tests over episodes."""

    n: int
    episodes: int
    acc_a: float
    acc_b: float
    only_a: int  # samples: A right, B wrong
    only_b: int  # samples: A wrong, B right
    p_two_sided: float
    p_drop: float  # one-sided: B worse than A
    diff: float  # acc_b - acc_a, each episode weighted equally (each stratum, with strata)
    diff_low: float
    diff_high: float


def paired(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, strata: np.ndarray | None = None,
           confidence: float = 0.95, seed: int = 0, flips: int | None = None, draws: int | None = None) -> Paired:
    """a, b: 0/1 outcomes of the two arms on the same samples; clusters: each pair's episode. The
    per-episode difference lies in [-1, 1]: its mean gets Gaffke's bounds. With `strata` (each
    sample's class, e.g. limit or control cell; an episode is in one) every stratum weighs the same
    (balanced accuracy): the accuracies and the difference are means of the strata's, and the sign-flip
    test flips each episode's difference weighted by 1 / its stratum's episodes. flips and draws: the
    Monte Carlo sizes of the test and the bound (default: the module's)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) != len(b) or len(a) != len(clusters):
        raise ValueError(f"paired arms need equal lengths, got {len(a)}, {len(b)}, {len(clusters)} clusters")
    if len(a) == 0:
        return Paired(0, 0, math.nan, math.nan, 0, 0, 1.0, 1.0, *NAN3)
    ea, eb = episode_means(a, clusters), episode_means(b, clusters)
    d = eb - ea
    if strata is None:
        per_episode, weight = None, np.ones(len(d))
    else:
        per_episode = pd.Series(np.asarray(strata)).groupby(pd.factorize(pd.Series(np.asarray(clusters)), sort=False)[0])
        if (per_episode.nunique() > 1).any():
            raise ValueError("an episode lies in two strata: strata must be constant within an episode")
        per_episode = per_episode.first().to_numpy()
        sizes = pd.Series(per_episode).map(pd.Series(per_episode).value_counts()).to_numpy(float)
        weight = len(d) / (sizes * len(set(per_episode.tolist())))  # mean(weight * d) = the mean of the strata's means
    diff = bounded_mean(d, -1.0, 1.0, strata=per_episode, confidence=confidence, seed=seed, draws=draws)
    acc = [float(np.mean(weight * e)) for e in (ea, eb)]
    return Paired(len(a), len(d), *acc, int(((a > 0) & (b <= 0)).sum()), int(((a <= 0) & (b > 0)).sum()),
                  sign_flip(weight * d, "two-sided", seed, flips), sign_flip(weight * d, "less", seed, flips),
                  diff.est, diff.low, diff.high)


def pass_hat_k(successes: np.ndarray, trials: np.ndarray, k: int, confidence: float = 0.95) -> Estimate:
    """Mean over episodes of C(c, k) / C(n, k): the chance that k replicates drawn without replacement
    all succeed, with Gaffke's bounds over episodes (each value in [0, 1]). NaN when an episode has
    fewer than k replicates."""
    c, n = np.asarray(successes), np.asarray(trials)
    if len(n) == 0 or k < 1 or (n < k).any():
        return Estimate(*NAN3, len(n))
    return bounded_mean(comb(c, k, exact=False) / comb(n, k, exact=False), 0.0, 1.0, confidence=confidence)


def median_interval(values: np.ndarray, confidence: float = 0.95) -> Estimate:
    """Median of one value per episode with its distribution-free interval (order statistics,
    binomial); NaN bounds when the episodes are too few for the confidence asked."""
    x = np.asarray(values, float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Estimate(*NAN3, 0)
    ci = sps.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence)
    return Estimate(float(np.median(x)), float(ci.low), float(ci.high), len(x))
