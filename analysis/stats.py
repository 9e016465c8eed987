"""The statistics, on plain arrays: scipy and statsmodels do the work, this module fixes the choices.

The episode is the unit of evidence. Replicates of one episode share its prompt, so they are not
independent draws: every interval and test here takes each sample's episode and works over episodes.

- proportions: Korn-Graubard intervals (Clopper-Pearson on the effective sample size: the samples
  divided by the design effect the episodes show, with episodes - 1 degrees of freedom);
- balanced accuracy: the mean of the per-class (limit cells, control cells) accuracies;
- means of episode-level values (a paired difference, pass^k, log-odds, shares): a t interval below
  MIN_BOOTSTRAP_EPISODES episodes, a percentile bootstrap over episodes from there on;
- two arms on the same episodes: the per-episode difference, with an exact sign-flip permutation
  test over episodes (Monte Carlo above EXACT_EPISODES episodes);
- pass^k: the chance that k replicates of one episode all succeed (tau-bench's estimator);
- growth: the OLS slope of thinking tokens against prompt tokens with episode-clustered errors,
  and the difference of two arms' slopes (their interaction) the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.special import comb

BOOTSTRAP_RESAMPLES = 2000
MIN_BOOTSTRAP_EPISODES = 20  # below: t intervals; a percentile bootstrap over few episodes is too narrow
EXACT_EPISODES = 16  # sign-flip tests enumerate all 2^n flips up to here
MONTE_CARLO_FLIPS = 9999
NAN3 = (math.nan, math.nan, math.nan)


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


def mean_interval(values: np.ndarray, *, confidence: float = 0.95, n_resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = 0) -> Estimate:
    """Mean of one value per episode (NaNs dropped): t interval below MIN_BOOTSTRAP_EPISODES, else a
    percentile bootstrap over episodes."""
    x = np.asarray(values, float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Estimate(*NAN3, 0)
    est = float(x.mean())
    if len(x) == 1:
        return Estimate(est, math.nan, math.nan, 1)
    if np.ptp(x) == 0:  # every episode says the same: no spread to estimate
        return Estimate(est, est, est, len(x))
    if len(x) < MIN_BOOTSTRAP_EPISODES:
        ci = sps.ttest_1samp(x, 0.0).confidence_interval(confidence)
    else:
        ci = sps.bootstrap((x,), np.mean, vectorized=True, n_resamples=n_resamples, confidence_level=confidence,
                           method="percentile", rng=np.random.default_rng(seed)).confidence_interval
    return Estimate(est, float(ci.low), float(ci.high), len(x))


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
    diff: float  # acc_b - acc_a, each episode weighted equally
    diff_low: float
    diff_high: float


def paired(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, confidence: float = 0.95, seed: int = 0,
           flips: int | None = None) -> Paired:
    """a, b: outcomes (0/1 or numbers) of the two arms on the same samples; clusters: each pair's episode."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) != len(b) or len(a) != len(clusters):
        raise ValueError(f"paired arms need equal lengths, got {len(a)}, {len(b)}, {len(clusters)} clusters")
    if len(a) == 0:
        return Paired(0, 0, math.nan, math.nan, 0, 0, 1.0, 1.0, *NAN3)
    ea, eb = episode_means(a, clusters), episode_means(b, clusters)
    d = eb - ea
    diff = mean_interval(d, confidence=confidence, seed=seed)
    return Paired(len(a), len(d), float(ea.mean()), float(eb.mean()), int(((a > 0) & (b <= 0)).sum()),
                  int(((a <= 0) & (b > 0)).sum()), sign_flip(d, "two-sided", seed, flips), sign_flip(d, "less", seed, flips),
                  diff.est, diff.low, diff.high)


def pass_hat_k(successes: np.ndarray, trials: np.ndarray, k: int, confidence: float = 0.95) -> Estimate:
    """Mean over episodes of C(c, k) / C(n, k): the chance that k replicates drawn without replacement
    all succeed, with its interval over episodes. NaN when an episode has fewer than k replicates."""
    c, n = np.asarray(successes), np.asarray(trials)
    if len(n) == 0 or k < 1 or (n < k).any():
        return Estimate(*NAN3, len(n))
    return mean_interval(comb(c, k, exact=False) / comb(n, k, exact=False), confidence=confidence)


def median_interval(values: np.ndarray, confidence: float = 0.95) -> Estimate:
    """Median of one value per episode with its distribution-free interval (order statistics,
    binomial); NaN bounds when the episodes are too few for the confidence asked."""
    x = np.asarray(values, float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Estimate(*NAN3, 0)
    ci = sps.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence)
    return Estimate(float(np.median(x)), float(ci.low), float(ci.high), len(x))


@dataclass
class Slope:
    slope: float
    low: float
    high: float
    intercept: float
    p_value: float
    n: int
    episodes: int = 0


def nan_slope(n: int, episodes: int) -> Slope:
    return Slope(math.nan, math.nan, math.nan, math.nan, math.nan, n, episodes)


def _clustered_fit(y: np.ndarray, design: np.ndarray, clusters: np.ndarray):
    """OLS with episode-clustered standard errors and t(episodes - 1) intervals."""
    import statsmodels.api as sm

    codes = pd.factorize(pd.Series(clusters), sort=False)[0]
    return sm.OLS(y, design).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)


def ols_slope(x: np.ndarray, y: np.ndarray, clusters: np.ndarray | None = None, *, confidence: float = 0.95) -> Slope:
    """OLS of y on x (with intercept): the slope, its interval and p-value, standard errors clustered
    by episode (each sample its own episode when clusters is None). NaN when x does not vary or
    fewer than 3 samples or 2 episodes remain."""
    import statsmodels.api as sm

    x, y = np.asarray(x, float), np.asarray(y, float)
    clusters = np.arange(len(x)) if clusters is None else np.asarray(clusters)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y, clusters = x[keep], y[keep], clusters[keep]
    episodes = len(set(clusters.tolist()))
    if len(x) < 3 or episodes < 2 or np.ptp(x) == 0:
        return nan_slope(len(x), episodes)
    if np.ptp(y) == 0:  # a perfectly flat line has no error to estimate
        return Slope(0.0, 0.0, 0.0, float(y[0]), 1.0, len(x), episodes)
    fit = _clustered_fit(y, sm.add_constant(x), clusters)
    low, high = fit.conf_int(alpha=1 - confidence)[1]
    return Slope(float(fit.params[1]), float(low), float(high), float(fit.params[0]), float(fit.pvalues[1]), len(x), episodes)


def slope_difference(x: np.ndarray, y: np.ndarray, arm: np.ndarray, clusters: np.ndarray, *,
                     confidence: float = 0.95) -> Slope:
    """Slope of arm 1 minus slope of arm 0 (arm: 0/1 per sample): the x-by-arm interaction of one OLS
    fit, errors clustered by episode (an episode seen in both arms is one cluster)."""
    x, y, arm = (np.asarray(v, float) for v in (x, y, arm))
    clusters = np.asarray(clusters)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y, arm, clusters = x[keep], y[keep], arm[keep], clusters[keep]
    episodes = len(set(clusters.tolist()))
    if episodes < 3 or any(np.ptp(x[arm == g]) == 0 if (arm == g).any() else True for g in (0, 1)):
        return nan_slope(len(x), episodes)
    design = np.column_stack([np.ones_like(x), x, arm, x * arm])
    if np.ptp(y) == 0:
        return Slope(0.0, 0.0, 0.0, 0.0, 1.0, len(x), episodes)
    fit = _clustered_fit(y, design, clusters)
    low, high = fit.conf_int(alpha=1 - confidence)[3]
    return Slope(float(fit.params[3]), float(low), float(high), float(fit.params[2]), float(fit.pvalues[3]), len(x), episodes)
