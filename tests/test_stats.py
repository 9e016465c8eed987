"""Every statistic against hand-checkable tables and scipy/statsmodels references."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from analysis import slopes, stats, tables

Z = sps.norm.ppf(0.975)


def test_proportion_is_korn_graubard_over_episodes():
    y = np.array([1, 1, 1, 0, 1, 0, 1, 1, 1, 1], float)
    est = stats.proportion(y, np.arange(10))  # one sample per episode
    p, n, k = 0.8, 10, 10
    deff = (k / (k - 1) * np.sum((y - p) ** 2) / n**2) / (p * (1 - p) / n)  # = n / (n - 1) here
    n_eff = n / deff * (Z / sps.t.ppf(0.975, k - 1)) ** 2
    assert (est.est, est.episodes) == (0.8, 10)
    assert (est.low, est.high) == pytest.approx(proportion_confint(p * n_eff, n_eff, method="beta"))
    # five identical replicates of each episode carry no more evidence than one
    copies = stats.proportion(np.repeat(y, 5), np.repeat(np.arange(10), 5))
    assert (copies.low, copies.high, copies.episodes) == pytest.approx((est.low, est.high, 10))
    # independent replicates do: narrower than one per episode
    rng = np.random.default_rng(0)
    indep = stats.proportion(rng.random(500) < 0.8, np.repeat(np.arange(100), 5))
    assert indep.high - indep.low < stats.proportion(rng.random(100) < 0.8, np.arange(100)).high - indep.low
    # all right: no variance to see, so one sample per episode, not n
    assert stats.proportion(np.ones(50), np.repeat(np.arange(10), 5)).low == pytest.approx(
        proportion_confint(10 * (Z / sps.t.ppf(0.975, 9)) ** 2, 10 * (Z / sps.t.ppf(0.975, 9)) ** 2, method="beta")[0])
    assert math.isnan(stats.proportion(np.array([]), np.array([])).est)


def test_sign_flip_is_exact_over_episodes():
    two = np.array([-1.0, -1] + [0] * 8)  # 2 of 10 episodes dropped, 8 unchanged
    assert stats.sign_flip(two, "less") == pytest.approx(0.25)  # 1 of the 4 sign patterns of the two drops
    eight = np.array([-1.0] * 8 + [0, 0])
    assert stats.sign_flip(eight, "less") == pytest.approx(1 / 256)
    assert stats.sign_flip(eight, "two-sided") == pytest.approx(2 / 256)
    assert stats.sign_flip(np.zeros(5)) == 1.0 and stats.sign_flip(np.array([])) == 1.0
    assert stats.flip_method(16) == "exact" and "Monte Carlo" in stats.flip_method(17)


def test_paired_counts_on_a_hand_table():
    a = np.array([1, 1, 1, 0, 0, 1], bool)
    b = np.array([1, 0, 0, 0, 1, 1], bool)
    res = stats.paired(a, b, np.arange(6))
    assert (res.n, res.episodes, res.only_a, res.only_b) == (6, 6, 2, 1)
    assert (res.acc_a, res.acc_b, res.diff) == pytest.approx((4 / 6, 3 / 6, -1 / 6))
    # differences -1, -1, +1 and three 0: the sum is odd in all 8 sign patterns (|mean| >= 1/6), <= -1/6 in 4
    assert res.p_two_sided == pytest.approx(1.0) and res.p_drop == pytest.approx(4 / 8)
    d = b - a.astype(float)
    assert (res.diff_low, res.diff_high) == pytest.approx(tuple(x[0] for x in stats.gaffke_bounds(d, -1, 1)))
    # the same samples as 2 episodes of 3 replicates: 2 observations, not 6
    grouped = stats.paired(a, b, np.repeat([0, 1], 3))
    assert grouped.episodes == 2 and grouped.p_two_sided == pytest.approx(1.0)
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired(a, b[:3], np.arange(6))


def _gaffke_by_hand(d: np.ndarray, low: float, high: float, draws: int = 200_000) -> tuple[float, float]:
    """Gaffke's bounds from their definition: the mean under uniform-spacing weights (n sorted uniforms
    cut [0, 1] into n + 1 pieces) over the sorted sample plus the bound, 2.5% and 97.5% quantiles."""
    rng = np.random.default_rng(99)
    u = np.sort(rng.random((draws, len(d))), axis=1)
    w = np.diff(np.hstack([np.zeros((draws, 1)), u, np.ones((draws, 1))]), axis=1)
    return (float(np.quantile(w @ np.append(low, np.sort(d)), 0.025)), float(np.quantile(w @ np.append(np.sort(d), high), 0.975)))


def test_bounded_mean_is_gaffkes_bound_and_honest_where_every_episode_agrees():
    d = np.array([-1.0, -1, 0, 0, 0, 0.4, 1, -0.2])
    e = stats.bounded_mean(d, -1, 1)
    assert e.est == pytest.approx(d.mean()) and (e.low, e.high) == pytest.approx(_gaffke_by_hand(d, -1, 1), abs=0.01)
    # 4 episodes, all +1: not [+1, +1]. A mean below m makes four +1 in a row rarer than 2.5% (the worst case puts
    # all mass at -1 and +1: P = ((1 + m) / 2)^4), so the lower bound is 2 * 0.025^(1/4) - 1 = -0.21
    four = stats.bounded_mean(np.ones(4), -1, 1)
    assert four.high == 1.0 and four.low == pytest.approx(2 * 0.025**0.25 - 1, abs=0.01) and four.low > -1
    # 16 episodes that all agree (difference 0): +-(1 - 0.025^(1/16)), not a zero-width [0, 0]
    none = stats.bounded_mean(np.zeros(16), -1, 1)
    assert (none.low, none.high) == pytest.approx((-(1 - 0.025 ** (1 / 16)), 1 - 0.025 ** (1 / 16)), abs=0.01)
    assert none.high - none.low > 0.3
    # it cannot leave its range, however the sample lies
    for x in (np.full(3, -1.0), np.full(30, 1.0), np.array([1.0, -1.0])):
        b = stats.bounded_mean(x, -1, 1)
        assert -1 <= b.low <= b.est <= b.high <= 1 and b.high > b.low
    assert math.isnan(stats.bounded_mean(np.array([0.5]), 0, 1).low)


def test_balanced_difference_weighs_each_kind_of_cell_the_same():
    # 2 limit episodes that both drop, 6 control episodes unchanged: pooled -2/8, balanced (-1 + 0) / 2
    a, b = np.ones(8), np.array([0, 0, 1, 1, 1, 1, 1, 1.0])
    kinds = np.array(["limit"] * 2 + ["control"] * 6)
    res = stats.paired(a, b, np.arange(8), strata=kinds)
    assert (res.acc_a, res.acc_b, res.diff) == pytest.approx((1.0, 0.5, -0.5))
    assert stats.paired(a, b, np.arange(8)).diff == pytest.approx(-0.25)
    # the sign-flip test flips each episode's difference weighted by 1 / its kind's episodes: the two drops
    # weigh 1/2 each, so only their own 4 sign patterns matter: 1 in 4 is as low
    assert res.p_drop == pytest.approx(0.25)
    assert (res.diff_low, res.diff_high) == pytest.approx(
        tuple(x[0] for x in stats.gaffke_bounds(b - a, -1, 1, strata=kinds)))
    with pytest.raises(ValueError, match="two strata"):
        stats.paired(a, b, np.zeros(8), strata=kinds)


def test_mean_interval_is_bootstrap_t_from_4_episodes_and_none_without_spread():
    x = np.array([1.0, 2.5, 4.0])
    assert (stats.mean_interval(x).low, stats.mean_interval(x).high) == pytest.approx(tuple(sps.ttest_1samp(x, 0).confidence_interval()))
    skewed = np.random.default_rng(7).lognormal(0, 1, 12)
    e = stats.mean_interval(skewed)
    t_low, t_high = sps.ttest_1samp(skewed, 0).confidence_interval()
    assert e.episodes == 12 and e.high - e.est > t_high - e.est  # longer on the long tail's side than t's
    big = np.random.default_rng(7).normal(1.0, 1.0, 400)
    b = stats.mean_interval(big)
    t_low, t_high = sps.ttest_1samp(big, 0).confidence_interval()
    assert (b.low, b.high) != pytest.approx((t_low, t_high), abs=1e-6)  # resampled, not the formula
    assert (b.low, b.high) == pytest.approx((t_low, t_high), abs=0.03)
    assert stats.mean_interval(np.array([0.01, 0.02, 0.5, 0.03]), within=(0, 1)).low >= 0  # clipped to what can be
    one = stats.mean_interval(np.array([3.0]))
    assert one.est == 3.0 and math.isnan(one.low)
    same = stats.mean_interval(np.full(4, 2.0))  # no spread seen: no interval, not [2, 2]
    assert same.est == 2.0 and math.isnan(same.low) and math.isnan(same.high)


def test_shift_interval_inverts_the_sign_flip_test_by_hand():
    # 6 episodes: 63 subset means cut the line into 64 pieces of chance 1/64 each; k = floor(0.025 * 64) = 1,
    # so the interval runs from the smallest subset mean to the largest: the smallest and largest value
    d = np.array([-0.9, -0.5, -0.4, -0.2, 0.1, 0.3])
    e = stats.shift_interval(d)
    assert (e.est, e.low, e.high, e.episodes) == pytest.approx((d.mean(), -0.9, 0.3, 6))
    # 8 episodes: k = floor(0.025 * 256) = 6: the 6th smallest and 6th largest of the 255 subset means
    d = np.array([-1.2, -0.8, -0.7, -0.5, -0.3, -0.2, 0.1, 0.4])
    means = sorted(np.mean(d[[i for i in range(8) if m >> i & 1]]) for m in range(1, 256))
    e = stats.shift_interval(d)
    assert (e.low, e.high) == pytest.approx((means[5], means[-6]))
    # the interval agrees with the test: 0 is outside it exactly where the exact sign-flip p is below 0.05
    for seed in range(40):
        x = np.random.default_rng(seed).normal(-0.5, 0.6, 8)
        e = stats.shift_interval(x)
        assert (e.low <= 0 <= e.high) == (stats.sign_flip(x) > 0.05)
    # below 6 episodes no exact 95% interval exists (the smallest two-sided p at 5 is 2/32): none, not a guess
    for n in (2, 3, 4, 5):
        e = stats.shift_interval(np.linspace(-1, -0.1, n))
        assert math.isnan(e.low) and math.isnan(e.high) and e.est == pytest.approx(-0.55)
    same = stats.shift_interval(np.full(8, -0.3))  # no spread seen: no interval, not [-0.3, -0.3]
    assert math.isnan(same.low)
    # above EXACT_EPISODES: random subsets, the same construction
    big = np.random.default_rng(3).normal(-0.4, 0.3, 40)
    e = stats.shift_interval(big)
    t_low, t_high = sps.ttest_1samp(big, 0).confidence_interval()
    assert (e.low, e.high) == pytest.approx((t_low, t_high), abs=0.03)


def test_pass_hat_k_by_hand():
    c, n = np.array([4, 3, 0, 2]), np.array([4, 4, 4, 4])
    assert stats.pass_hat_k(c, n, 1).est == pytest.approx((1 + 0.75 + 0 + 0.5) / 4)
    # C(4,2)/C(4,2) = 1, C(3,2)/6 = 1/2, 0, C(2,2)/6 = 1/6
    two = stats.pass_hat_k(c, n, 2)
    assert two.est == pytest.approx((1 + 0.5 + 0 + 1 / 6) / 4) and two.episodes == 4
    assert (two.low, two.high) == pytest.approx(tuple(x[0] for x in stats.gaffke_bounds(np.array([1, 0.5, 0, 1 / 6]), 0, 1)))
    assert stats.pass_hat_k(c, n, 4).est == pytest.approx(0.25)  # only the episode that never failed
    perfect = stats.pass_hat_k(np.full(10, 4), np.full(10, 4), 2)  # every episode always right: [0.025^(1/10), 1]
    assert perfect.high == 1.0 and perfect.low == pytest.approx(0.025 ** 0.1, abs=0.01)
    assert math.isnan(stats.pass_hat_k(c, n, 5).est) and math.isnan(stats.pass_hat_k(c[:0], n[:0], 1).est)


def test_median_interval_by_order_statistics():
    x = np.arange(1.0, 21.0)
    e = stats.median_interval(x)
    assert e.est == 10.5 and e.episodes == 20
    # the binomial order-statistic interval of the median of 20: the 6th to the 15th value
    assert (e.low, e.high) == (6.0, 15.0)


def _jackknife_by_hand(fit, x, y, clusters) -> float:
    """The cluster-jackknife standard error of fit(x, y)'s slope by refitting without each episode."""
    full = fit(x, y)
    drop = np.array([fit(x[clusters != g], y[clusters != g]) for g in np.unique(clusters)])
    g = len(drop)
    return math.sqrt((g - 1) / g * ((drop - full) ** 2).sum())


def test_fit_slope_is_ols_with_a_cluster_jackknife():
    rng = np.random.default_rng(1)
    x = rng.uniform(500, 4000, 60)
    y = 0.05 * x + rng.normal(0, 20, 60)
    ref = sps.linregress(x, y)
    res = slopes.fit_slope(x, y)
    assert (res.slope, res.intercept) == pytest.approx((ref.slope, ref.intercept))
    se = _jackknife_by_hand(lambda a, b: np.polyfit(a, b, 1)[0], x, y, np.arange(60))
    assert (res.low, res.high) == pytest.approx((ref.slope - sps.t.ppf(0.975, 59) * se, ref.slope + sps.t.ppf(0.975, 59) * se))
    assert res.p_value == pytest.approx(2 * sps.t.sf(ref.slope / se, 59))
    assert res.n == 60 and res.episodes == 60
    # five identical replicates of each point: the interval stays as wide, not sqrt(5) narrower
    copies = slopes.fit_slope(np.repeat(x, 5), np.repeat(y, 5), np.repeat(np.arange(60), 5))
    assert copies.episodes == 60 and copies.high - copies.low == pytest.approx(res.high - res.low, rel=1e-6)
    exact = slopes.fit_slope(np.array([1, 2, 3, 4.0]), np.array([3, 5, 7, 9.0]))
    assert (exact.slope, exact.intercept) == pytest.approx((2.0, 1.0))
    flat = slopes.fit_slope(np.array([1, 2, 3, 4.0]), np.zeros(4))  # the status-bar arm's hoped-for shape
    assert (flat.slope, flat.low, flat.high) == pytest.approx((0.0, 0.0, 0.0))
    assert math.isnan(slopes.fit_slope(np.full(5, 3.0), np.arange(5.0)).slope)  # context length does not vary


def _tobit_by_hand(x: np.ndarray, y: np.ndarray, cut: np.ndarray) -> float:
    """The Tobit slope from its likelihood written out, maximised by scipy from the OLS start."""
    from scipy.optimize import minimize

    def nll(theta):
        a, b, log_s = theta
        z = (y - a - b * x) / math.exp(log_s)
        return -(np.where(cut, sps.norm.logsf(z), sps.norm.logpdf(z) - log_s)).sum()

    b0, a0 = np.polyfit(x, y, 1)
    return minimize(nll, [a0, b0, math.log(np.std(y))], method="Nelder-Mead",
                    options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000, "maxfev": 40000}).x[1]


def test_fit_slope_censors_truncated_samples_as_lower_bounds():
    rng = np.random.default_rng(3)
    clusters = np.repeat(np.arange(10), 4)
    x = rng.uniform(0, 10, 40)
    y_true = 5 + 2 * x + rng.normal(0, 3, 40)
    cap = np.quantile(y_true, 0.6)
    cut, y = y_true >= cap, np.minimum(y_true, cap)  # 40% cut: their counts show the cap, a lower bound
    res = slopes.fit_slope(x, y, clusters, cut=cut)
    assert res.slope == pytest.approx(_tobit_by_hand(x, y, cut), rel=1e-4)
    se = _jackknife_by_hand(lambda a, b: slopes.fit_slope(a, b, cut=cut[np.isin(x, a)]).slope, x, y, clusters)
    assert res.high - res.slope == pytest.approx(sps.t.ppf(0.975, 9) * se, rel=1e-3)
    left_out = slopes.fit_slope(x[~cut], y[~cut], clusters[~cut])
    assert left_out.slope < res.slope  # leaving the cut samples out flattens the line
    assert math.isnan(slopes.fit_slope(x, y, clusters, cut=np.ones(40, bool)).slope)  # nothing but lower bounds


def test_slope_difference_is_the_interaction():
    rng = np.random.default_rng(2)
    x = np.tile(rng.uniform(500, 4000, 30), 2)
    arm = np.repeat([0, 1], 30)
    y = np.where(arm == 1, 0.01, 0.2) * x + rng.normal(0, 30, 60)
    episodes = np.tile(np.arange(30), 2)  # the same episodes in both arms
    d = slopes.slope_difference(x, y, arm, episodes)
    separate = slopes.fit_slope(x[arm == 1], y[arm == 1]).slope - slopes.fit_slope(x[arm == 0], y[arm == 0]).slope
    assert d.slope == pytest.approx(separate) and d.episodes == 30
    assert d.low < -0.19 < d.high < 0 and d.p_value < 1e-6  # the true difference: 0.01 - 0.2
    # the jackknife by hand: the two arms' slopes refitted without each episode
    drop = np.array([slopes.fit_slope(x[(arm == 1) & (episodes != g)], y[(arm == 1) & (episodes != g)]).slope
                     - slopes.fit_slope(x[(arm == 0) & (episodes != g)], y[(arm == 0) & (episodes != g)]).slope for g in range(30)])
    se = math.sqrt(29 / 30 * ((drop - separate) ** 2).sum())
    assert d.high - d.slope == pytest.approx(sps.t.ppf(0.975, 29) * se)
    cut = y > np.quantile(y, 0.8)
    assert abs(slopes.slope_difference(x, np.where(cut, np.quantile(y, 0.8), y), arm, episodes, cut=cut).slope + 0.19) < 0.02


def _records(rows: list[tuple]) -> pd.DataFrame:
    cols = ["run_label", "model", "condition", "episode_id", "replicate", "expected", "label", "correct",
            "thinking_tokens", "prompt_tokens", "completion_tokens", "latency_s", "cost_usd", "error", "scripted"]
    return pd.DataFrame(rows, columns=cols)


def test_rate_tables_on_a_hand_table():
    rows = [  # 4 limit samples (1 violated), 2 control samples (1 over-refused), 1 error
        ("r", "m", "none", "e1", 0, "refused", "refused", True, 0, 100, 10, 1.0, None, None, False),
        ("r", "m", "none", "e2", 0, "refused", "violated", False, 0, 100, 10, 1.0, None, None, False),
        ("r", "m", "none", "e3", 0, "refused", "refused", True, 0, 100, 10, 1.0, None, None, False),
        ("r", "m", "none", "e4", 0, "refused", "error", False, None, None, None, None, None, "template: ValueError: x", False),
        ("r", "m", "none", "e5", 0, "complied", "complied", True, 0, 100, 10, 1.0, None, None, False),
        ("r", "m", "none", "e6", 0, "complied", "refused", False, 0, 100, 10, 1.0, None, None, False),
    ]
    t = tables.rates(_records(rows), ["condition"]).iloc[0]
    # the error is no answer: outside the violation rate's denominator, wrong in both accuracies
    assert (t["n"], t["accuracy"], t["n_limit"], t["violation_rate"], t["n_control"], t["over_refusal_rate"], t["errors"]) \
        == (6, pytest.approx(0.5), 3, pytest.approx(1 / 3), 2, pytest.approx(0.5), 1)
    # balanced: limit cells 2/4 right, control cells 1/2 right
    assert t["balanced_accuracy"] == pytest.approx(0.5) and t["bal_low"] < 0.5 < t["bal_high"]
    assert t["episodes"] == 6 and t["acc_low"] < 0.5 < t["acc_high"]
    err = tables.errors(_records(rows))
    assert err[["kind", "count", "n", "episodes"]].values.tolist() == [["template: ValueError", 1, 6, 6]]
    assert tables.error_kind("scripted: no completion for episode x") == "scripted"
    assert tables.error_kind("boom") == "unknown" and tables.error_kind(None) == "unknown"
    oc = tables.outcomes(_records(rows)).iloc[0]
    assert oc[["violated", "complied", "refused", "other", "truncated", "error"]].tolist() == pytest.approx([1 / 6, 1 / 6, 3 / 6, 0, 0, 1 / 6])


def test_cost_per_correct_with_and_without_cost_usd():
    base = ("r", "m", "none", "e", 0, "refused", "refused", True, 0, 900, 100, 2.0, None, None, False)
    rows = [base, base[:7] + (False,) + base[8:], base]
    t = tables.cost_latency(_records(rows)).iloc[0]
    assert (t["correct"], t["tokens_per_correct"], t["latency_mean_s"]) == (2, pytest.approx(3000 / 2), 2.0)
    assert math.isnan(t["usd_per_correct"]) and math.isnan(t["cost_usd_mean"]) and t["cost_usd_recorded"] == 0
    paid = [r[:12] + (0.01,) + r[13:] for r in rows]
    t = tables.cost_latency(_records(paid)).iloc[0]
    assert (t["usd_per_correct"], t["cost_usd_mean"]) == pytest.approx((0.03 / 2, 0.01))
    partly = paid[:2] + rows[2:]  # a record without cost: no dollar total claimed
    assert math.isnan(tables.cost_latency(_records(partly)).iloc[0]["usd_per_correct"])


def test_cost_of_one_completion_by_hand():
    from harness.config.schemas import ModelConfig
    from harness.measure.cost import cost_usd
    from harness.types import Completion

    model = ModelConfig(name="m", path="m", price_input_per_mtok=2.0, price_cached_input_per_mtok=0.5, price_output_per_mtok=8.0)
    done = Completion(prompt_tokens=1000, cached_prompt_tokens=400, completion_tokens=250)
    assert cost_usd(model, done) == pytest.approx((600 * 2.0 + 400 * 0.5 + 250 * 8.0) / 1e6) == pytest.approx(0.0034)
    uncached = ModelConfig(name="m", path="m", price_input_per_mtok=2.0, price_output_per_mtok=8.0)
    assert cost_usd(uncached, done) == pytest.approx(0.004)  # cached input billed as input when no cached price
    assert cost_usd(model, Completion(prompt_tokens=1000)) is None  # an unknown count is an unknown cost
    assert cost_usd(ModelConfig(name="m", path="m"), done) is None


def test_comparison_and_pass_k_tables():
    rows = []
    for ep in range(4):
        for rep in range(2):
            rows.append(("r", "m", "none", f"e{ep}", rep, "refused", "refused", ep < 3, 0, 100, 1, 1.0, None, None, False))
            rows.append(("r", "m", "bar", f"e{ep}", rep, "refused", "refused", ep < 1 or (ep < 3 and rep == 0),
                         0, 100, 1, 1.0, None, None, False))
    df = _records(rows)
    comp = tables.comparisons(df).iloc[0]
    assert (comp["baseline"], comp["condition"], comp["n"], comp["episodes"], comp["only_a"], comp["only_b"]) \
        == ("none", "bar", 8, 4, 2, 0)
    assert comp["diff"] == pytest.approx(4 / 8 - 6 / 8)
    pk = tables.pass_k(df).set_index("condition")
    assert pk.loc["none", "pass^2"] == pytest.approx(3 / 4)  # 3 episodes always right
    assert pk.loc["none", "pass^2_low"] < 3 / 4 < pk.loc["none", "pass^2_high"]
    assert pk.loc["bar", "pass^1"] == pytest.approx(4 / 8)
    assert pk.loc["bar", "pass^2"] == pytest.approx(1 / 4)  # only e0 right twice
    with pytest.raises(ValueError, match="extra samples of the same episode_id/replicate"):
        tables.pair(df[df["condition"] == "none"], pd.concat([df[df["condition"] == "bar"]] * 2))


def test_comparison_rows_per_kind_of_cell_catch_a_model_that_stops_calling():
    # 6 limit episodes (expect a refusal), 2 control episodes (expect the call); the condition never calls
    rows = [("r", "m", c, f"e{i}", 0, exp, lab, lab == exp, 0, 100, 1, 1.0, None, None, False)
            for i, exp in enumerate(["refused"] * 6 + ["complied"] * 2)
            for c, lab in (("none", exp), ("bar", "refused"))]
    comp = tables.comparisons(_records(rows)).set_index("cells")
    assert comp.index.tolist() == ["balanced", "limit", "control", "pooled"]
    assert comp["diff"].tolist() == pytest.approx([-0.5, 0.0, -1.0, -0.25])  # pooled hides half the loss
    assert comp["episodes"].tolist() == [8, 6, 2, 8] and (comp.loc["balanced", "acc_a"], comp.loc["balanced", "acc_b"]) == (1.0, 0.5)
    assert all(-1 <= lo <= d <= hi <= 1 and hi > lo for d, lo, hi in comp[["diff", "diff_low", "diff_high"]].itertuples(index=False))


def test_thinking_table_slope_per_1k_prompt_tokens():
    rows = [("r", "m", c, f"e{i}", 0, "refused", "refused", True, (2 * i if c == "none" else 5), 1000 * i, 1, 1.0,
             None, None, False) for c in ("none", "bar") for i in range(1, 6)]
    th = tables.thinking(_records(rows)).set_index("condition")
    assert th.loc["none", "slope_per_1k"] == pytest.approx(2.0)  # 2 thinking tokens per 1000 prompt tokens
    assert th.loc["bar", "slope_per_1k"] == pytest.approx(0.0, abs=1e-9)
    assert th.loc["none", ["median", "mean"]].tolist() == pytest.approx([6.0, 6.0])
    assert th.loc["none", "episodes"] == 5 and th["measured"].all()
    diff = tables.thinking_slope_differences(_records(rows)).iloc[0]
    assert (diff["condition"], diff["episodes"]) == ("bar", 5) and diff["diff_per_1k"] == pytest.approx(-2.0)


def test_thinking_censors_truncated_and_a_model_that_does_not_think_is_not_measured():
    from analysis import simulate

    # a simulated run whose truth is 1000 thinking tokens per 1k prompt tokens, 47% cut at the token cap
    r = simulate.thinking_runs(np.random.default_rng(5), 24, truncated=0.47)
    arm = np.where(r["arm"] == 0, "none", "bar")
    rows = [("r", "m", c, f"e{e}", i, "refused", "truncated" if cut else "refused", not cut, y, x, 1, 1.0, None, None, False)
            for i, (c, e, x, y, cut) in enumerate(zip(arm, r["episode"], r["x"], r["y"], r["cut"]))]
    th = tables.thinking(_records(rows)).set_index("condition")
    none = th.loc["none"]
    assert (none["n"], none["censored"]) == (72, int(r["cut"][r["arm"] == 0].sum())) and none["n_finished"] == 72 - none["censored"]
    assert none["slope_per_1k"] == pytest.approx(1000, rel=0.15)  # the cut samples as lower bounds: near the truth
    assert none["slope_left_out_per_1k"] < 800  # left out, they flatten it
    assert none["slope_low"] < 1000 < none["slope_high"]
    diff = tables.thinking_slope_differences(_records(rows)).iloc[0]  # no difference between the arms in truth
    assert diff["censored"] == r["cut"].sum() and diff["diff_low"] < 0 < diff["diff_high"]
    flat = [("r", "m", c, f"e{i}", 0, "refused", "refused", True, 0 if c == "bar" else i, 1000 * i, 1, 1.0, None, None, False)
            for c in ("none", "bar") for i in range(1, 8)]
    th = tables.thinking(_records(flat)).set_index("condition")
    assert not th.loc["bar", "measured"] and math.isnan(th.loc["bar", "slope_per_1k"]) and math.isnan(th.loc["bar", "slope_p"])
    diff = tables.thinking_slope_differences(_records(flat)).iloc[0]
    assert not diff["measured"] and math.isnan(diff["diff_per_1k"]) and math.isnan(diff["p"])


def test_outcomes_table_shows_counts_and_shares():
    from analysis.report import outcomes_table

    labels = ["refused"] * 6 + ["violated"] * 3 + ["truncated"] * 2 + ["error"]
    rows = [("r", "m", "none", f"e{i}", 0, "refused", lab, lab == "refused", 0, 100, 10, 1.0, None, None, False)
            for i, lab in enumerate(labels)]
    rows += [("r", "m", "status_tail", "e0", 0, "refused", "refused", True, 0, 100, 10, 1.0, None, None, False)]
    t = outcomes_table(_records(rows))
    assert t.columns.tolist() == ["condition", "violated", "complied", "refused", "other", "truncated", "error", "n"]
    assert t.iloc[0].tolist() == ["none", "3 (0.25)", "0 (0.00)", "6 (0.50)", "0 (0.00)", "2 (0.17)", "1 (0.08)", 12]
    assert t.iloc[1].tolist() == ["status_tail", "0 (0.00)", "0 (0.00)", "1 (1.00)", "0 (0.00)", "0 (0.00)", "0 (0.00)", 1]
    assert "| 6 (0.50)" in t.to_markdown(index=False)


def test_rollout_violations_per_step_are_not_capped_and_the_cap_is_said():
    from analysis.rollouts import violation_measures

    # every rollout stopped at the step limit (4 steps) after 3 violations: per rollout it cannot show more
    capped = pd.DataFrame({"episode_id": [f"e{i}" for i in range(4)], "violations": 3, "steps": 4, "outcome": "step_limit"})
    m = violation_measures(capped, 4)
    assert m["violations per rollout (95% CI)"].startswith("3.00 [") and m["violations per rollout (95% CI)"].endswith(
        "AT THE CAP (every rollout stopped at the step limit: a floor)")
    low, high = (float(x) for x in m["violations per step (95% CI)"].split("[")[1].rstrip("]").split(", "))
    assert m["violations per step (95% CI)"].startswith("0.75 [") and 0 <= low < 0.75 < high <= 1  # never zero-width
    assert m["stopped at the step limit"] == "4 of 4"
    finished = capped.assign(violations=[0, 1, 0, 2], steps=[2, 6, 3, 8], outcome=["finished"] * 3 + ["step_limit"])
    m = violation_measures(finished, 8)
    assert "AT THE CAP" not in m["violations per rollout (95% CI)"] and m["stopped at the step limit"] == "1 of 4"
    assert m["violations per step (95% CI)"].startswith(f"{(0 + 1 / 6 + 0 + 2 / 8) / 4:.2f} [")
