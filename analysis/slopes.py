"""Growth: the slope of thinking tokens against prompt tokens, censored (Tobit) where a sample was cut
at the token limit (its count is a lower bound), and the difference of two arms' slopes (their
interaction), with cluster-jackknife (CR3) errors over episodes and t on episodes - 1 degrees of
freedom, which hold their level at 6 episodes where the usual clustered errors reject twice too often
(checked by `analysis.simulate`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.special import log_ndtr


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


def _design_ok(design: np.ndarray, keep: np.ndarray) -> bool:
    return np.linalg.matrix_rank(design[keep]) == design.shape[1]


def _tobit_ll(theta: np.ndarray, design: np.ndarray, y: np.ndarray, cut: np.ndarray, mask: np.ndarray):
    """Log-likelihood of a Tobit model right-censored at y where `cut`, in Olsen's parameters
    theta = (beta / sigma, 1 / sigma), in which it is concave; one row of theta per row of mask (the
    samples that count: a leave-one-episode-out fit drops an episode's). Also (the linear index
    x gamma - h y per sample, its log normal CDF) for the derivatives."""
    gamma, h = theta[:, :-1], theta[:, -1:]
    lin = gamma @ design.T - h * y  # [rows, samples]
    log_cdf = log_ndtr(lin)
    with np.errstate(divide="ignore", invalid="ignore"):  # a trial step past 1 / sigma = 0 is refused, not an error
        ll = (mask * np.where(cut, log_cdf, np.log(h) - 0.5 * lin**2)).sum(axis=1)
    return np.where(np.isfinite(ll), ll, -np.inf), lin, log_cdf


def _tobit_derivatives(theta: np.ndarray, design: np.ndarray, y: np.ndarray, cut: np.ndarray, mask: np.ndarray):
    """(log-likelihood, gradient, Hessian) of `_tobit_ll`, per row."""
    ll, lin, log_cdf = _tobit_ll(theta, design, y, cut, mask)
    h = theta[:, -1]
    v = np.column_stack([design, -y])  # the derivatives of the linear index
    mills = np.exp(-0.5 * lin**2 - 0.5 * math.log(2 * math.pi) - log_cdf)
    a = np.where(cut, mills, -lin)  # gradient weight on v per sample
    b = np.where(cut, mills * (lin + mills), 1.0)  # Hessian weight on v v' per sample
    exact = (mask * ~cut).sum(axis=1)
    grad = (mask * a) @ v
    grad[:, -1] += exact / h
    hess = -np.einsum("rn,ni,nj->rij", mask * b, v, v)
    hess[:, -1, -1] -= exact / h**2
    return ll, grad, hess


def _tobit(theta: np.ndarray, design: np.ndarray, y: np.ndarray, cut: np.ndarray, mask: np.ndarray,
           steps: int = 100) -> np.ndarray:
    """Newton's method with step halving, one fit per row of theta and mask; NaN rows where it does
    not converge."""
    done = np.zeros(len(theta), bool)
    for _ in range(steps):
        ll, grad, hess = _tobit_derivatives(theta, design, y, cut, mask)
        step = np.linalg.solve(hess, grad[..., None])[..., 0]
        scale = np.ones((len(theta), 1))
        for _ in range(40):  # halve until the likelihood does not fall (a step past 1 / sigma = 0 makes it -inf)
            trial = theta - scale * step
            worse = _tobit_ll(trial, design, y, cut, mask)[0] < ll - 1e-12 * np.abs(ll)
            if not worse.any():
                break
            scale[worse] /= 2
        done |= np.abs(scale * step).max(axis=1) < 1e-9 * (1 + np.abs(theta).max(axis=1))
        theta = trial
        if done.all():
            return theta
    return np.where(done[:, None], theta, math.nan)


def _fits(y: np.ndarray, design: np.ndarray, cut: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Coefficients of one fit per row of masks (the first: every sample): least squares when no
    sample is cut, else Tobit, the first fit from the least-squares start and the others from it."""
    if not cut.any():
        gram = np.einsum("rn,ni,nj->rij", masks, design, design)
        return np.linalg.solve(gram, ((masks * y) @ design)[..., None])[..., 0]
    scale_y = np.std(y) or 1.0  # in units where y and each column are of order 1
    scale_x = np.where(np.ptp(design, axis=0) > 0, np.std(design, axis=0), 1.0)
    z, yz = design / scale_x, y / scale_y
    beta = np.linalg.lstsq(z, yz, rcond=None)[0]
    sigma = max(float(np.std(yz - z @ beta)), 1e-3)
    full = _tobit(np.append(beta / sigma, 1 / sigma)[None], z, yz, cut, masks[:1])
    thetas = np.vstack([full, _tobit(np.repeat(full, len(masks) - 1, axis=0), z, yz, cut, masks[1:])])
    return thetas[:, :-1] / thetas[:, -1:] * scale_y / scale_x


def censored_fit(y: np.ndarray, design: np.ndarray, clusters: np.ndarray, cut: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """(coefficients, their covariance, episodes) of y on design (a constant column included): OLS
    when no sample is cut, else a Tobit fit in which a cut sample's y is a lower bound (right-censored
    there; normal errors of one variance assumed). The covariance is the cluster jackknife (CR3): the
    spread of the fits that leave one episode out, times (G - 1) / G, which holds its level at few
    episodes where the sandwich (CR1) is too small. NaN coefficients when the uncut samples do not
    pin every coefficient (the Tobit likelihood has no maximum then); NaN covariance when that
    happens with an episode left out."""
    y, design = np.asarray(y, float), np.asarray(design, float)
    cut = np.zeros(len(y), bool) if cut is None else np.asarray(cut, bool)
    codes = pd.factorize(pd.Series(np.asarray(clusters)), sort=False)[0]
    episodes = int(codes.max()) + 1
    masks = np.vstack([np.ones(len(y))] + [(codes != g).astype(float) for g in range(episodes)])
    ok = [_design_ok(design, (m > 0) & ~cut) for m in masks]
    nan = np.full((design.shape[1],) * 2, math.nan)
    if not ok[0]:
        return np.full(design.shape[1], math.nan), nan, episodes
    if not all(ok):
        return _fits(y, design, cut, masks[:1])[0], nan, episodes
    fits = _fits(y, design, cut, masks)
    coef, dev = fits[0], fits[1:] - fits[0]
    return coef, (episodes - 1) / episodes * dev.T @ dev, episodes


def _slope(coef: np.ndarray, cov: np.ndarray, j: int, intercept: float, n: int, episodes: int, confidence: float) -> Slope:
    """Slope j of a censored_fit with its t interval and p on episodes - 1 degrees of freedom."""
    se, df = math.sqrt(cov[j, j]) if cov[j, j] >= 0 else math.nan, episodes - 1
    if se == 0:  # an exact line: every episode's fit agrees
        return Slope(float(coef[j]), float(coef[j]), float(coef[j]), intercept, 0.0 if coef[j] else 1.0, n, episodes)
    half = sps.t.ppf(0.5 + confidence / 2, df) * se
    return Slope(float(coef[j]), float(coef[j] - half), float(coef[j] + half), intercept,
                 float(2 * sps.t.sf(abs(coef[j]) / se, df)), n, episodes)


def _complete(x: np.ndarray, y: np.ndarray, clusters, cut, *more):
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = ~(np.isnan(x) | np.isnan(y))
    cut = np.zeros(len(x), bool) if cut is None else np.asarray(cut, bool)
    clusters = np.arange(len(x)) if clusters is None else np.asarray(clusters)
    return (v[keep] for v in (x, y, clusters, cut, *(np.asarray(m) for m in more)))


def fit_slope(x: np.ndarray, y: np.ndarray, clusters: np.ndarray | None = None, *, cut: np.ndarray | None = None,
              confidence: float = 0.95) -> Slope:
    """Slope of y on x (with intercept): OLS, or Tobit where `cut` marks samples whose y is a lower
    bound (a completion cut at the token limit before its thinking ended); interval and p from the
    cluster jackknife over episodes (each sample its own episode when clusters is None), t on
    episodes - 1 degrees of freedom. NaN when x does not vary, fewer than 3 samples or 2 episodes
    remain, or no sample is uncut."""
    x, y, clusters, cut = _complete(x, y, clusters, cut)
    episodes = len(set(clusters.tolist()))
    if len(x) < 3 or episodes < 2 or np.ptp(x) == 0 or cut.all():
        return nan_slope(len(x), episodes)
    coef, cov, episodes = censored_fit(y, np.column_stack([np.ones_like(x), x]), clusters, cut)
    return _slope(coef, cov, 1, float(coef[0]), len(x), episodes, confidence)


def slope_difference(x: np.ndarray, y: np.ndarray, arm: np.ndarray, clusters: np.ndarray, *,
                     cut: np.ndarray | None = None, confidence: float = 0.95) -> Slope:
    """Slope of arm 1 minus slope of arm 0 (arm: 0/1 per sample): the x-by-arm interaction of one fit
    (`fit_slope`'s: Tobit where samples are cut), cluster jackknife over episodes (an episode seen in
    both arms is one cluster). `intercept` holds the arms' difference at x = 0."""
    x, y, clusters, cut, arm = _complete(x, y, clusters, cut, arm)
    arm = arm.astype(float)
    episodes = len(set(clusters.tolist()))
    if episodes < 3 or cut.all() or any(np.ptp(x[arm == g]) == 0 if (arm == g).any() else True for g in (0, 1)):
        return nan_slope(len(x), episodes)
    coef, cov, episodes = censored_fit(y, np.column_stack([np.ones_like(x), x, arm, x * arm]), clusters, cut)
    return _slope(coef, cov, 3, float(coef[2]), len(x), episodes, confidence)
