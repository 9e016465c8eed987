"""Every statistic against hand-checkable tables and scipy/statsmodels references."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from analysis import stats, tables

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
    assert (res.diff_low, res.diff_high) == pytest.approx(tuple(sps.ttest_1samp(b - a.astype(float), 0).confidence_interval()))
    # the same samples as 2 episodes of 3 replicates: 2 observations, not 6
    grouped = stats.paired(a, b, np.repeat([0, 1], 3))
    assert grouped.episodes == 2 and grouped.p_two_sided == pytest.approx(1.0)
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired(a, b[:3], np.arange(6))


def test_mean_interval_is_t_below_20_episodes_and_a_bootstrap_from_there():
    x = np.random.default_rng(7).normal(1.0, 1.0, 12)
    e = stats.mean_interval(x)
    assert (e.low, e.high) == pytest.approx(tuple(sps.ttest_1samp(x, 0).confidence_interval()))
    assert e.episodes == 12
    big = np.random.default_rng(7).normal(1.0, 1.0, 400)
    b = stats.mean_interval(big)
    t_low, t_high = sps.ttest_1samp(big, 0).confidence_interval()
    assert (b.low, b.high) != pytest.approx((t_low, t_high), abs=1e-6)  # resampled, not the formula
    assert (b.low, b.high) == pytest.approx((t_low, t_high), abs=0.03)
    one = stats.mean_interval(np.array([3.0]))
    assert one.est == 3.0 and math.isnan(one.low)
    assert stats.mean_interval(np.full(4, 2.0)) == stats.Estimate(2.0, 2.0, 2.0, 4)


def test_pass_hat_k_by_hand():
    c, n = np.array([4, 3, 0, 2]), np.array([4, 4, 4, 4])
    assert stats.pass_hat_k(c, n, 1).est == pytest.approx((1 + 0.75 + 0 + 0.5) / 4)
    # C(4,2)/C(4,2) = 1, C(3,2)/6 = 1/2, 0, C(2,2)/6 = 1/6
    two = stats.pass_hat_k(c, n, 2)
    assert two.est == pytest.approx((1 + 0.5 + 0 + 1 / 6) / 4) and two.episodes == 4
    assert (two.low, two.high) == pytest.approx(tuple(sps.ttest_1samp([1, 0.5, 0, 1 / 6], 0).confidence_interval()))
    assert stats.pass_hat_k(c, n, 4).est == pytest.approx(0.25)  # only the episode that never failed
    assert math.isnan(stats.pass_hat_k(c, n, 5).est) and math.isnan(stats.pass_hat_k(c[:0], n[:0], 1).est)


def test_median_interval_by_order_statistics():
    x = np.arange(1.0, 21.0)
    e = stats.median_interval(x)
    assert e.est == 10.5 and e.episodes == 20
    # the binomial order-statistic interval of the median of 20: the 6th to the 15th value
    assert (e.low, e.high) == (6.0, 15.0)


def test_ols_slope_clusters_by_episode():
    import statsmodels.api as sm

    rng = np.random.default_rng(1)
    x = rng.uniform(500, 4000, 60)
    y = 0.05 * x + rng.normal(0, 20, 60)
    ref = sps.linregress(x, y)
    res = stats.ols_slope(x, y)
    fit = sm.OLS(y, sm.add_constant(x)).fit(cov_type="cluster", cov_kwds={"groups": np.arange(60)}, use_t=True)
    assert (res.slope, res.intercept) == pytest.approx((ref.slope, ref.intercept))
    assert (res.low, res.high) == pytest.approx(tuple(fit.conf_int()[1]))
    assert res.n == 60 and res.episodes == 60
    # five identical replicates of each point: the interval stays about as wide, not sqrt(5) narrower
    copies = stats.ols_slope(np.repeat(x, 5), np.repeat(y, 5), np.repeat(np.arange(60), 5))
    assert copies.episodes == 60 and copies.high - copies.low == pytest.approx(res.high - res.low, rel=0.05)
    exact = stats.ols_slope(np.array([1, 2, 3, 4.0]), np.array([3, 5, 7, 9.0]))
    assert (exact.slope, exact.intercept) == pytest.approx((2.0, 1.0))
    flat = stats.ols_slope(np.array([1, 2, 3, 4.0]), np.zeros(4))  # the status-bar arm's hoped-for shape
    assert (flat.slope, flat.low, flat.high) == pytest.approx((0.0, 0.0, 0.0))
    assert math.isnan(stats.ols_slope(np.full(5, 3.0), np.arange(5.0)).slope)  # context length does not vary


def test_slope_difference_is_the_interaction():
    rng = np.random.default_rng(2)
    x = np.tile(rng.uniform(500, 4000, 30), 2)
    arm = np.repeat([0, 1], 30)
    y = np.where(arm == 1, 0.01, 0.2) * x + rng.normal(0, 30, 60)
    episodes = np.tile(np.arange(30), 2)  # the same episodes in both arms
    d = stats.slope_difference(x, y, arm, episodes)
    separate = stats.ols_slope(x[arm == 1], y[arm == 1]).slope - stats.ols_slope(x[arm == 0], y[arm == 0]).slope
    assert d.slope == pytest.approx(separate) and d.episodes == 30
    assert d.low < -0.19 < d.high < 0 and d.p_value < 1e-6  # the true difference: 0.01 - 0.2


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


def test_thinking_excludes_truncated_and_a_model_that_does_not_think_is_not_measured():
    rows = [("r", "m", "none", f"e{i}", 0, "refused", "refused", True, i, 1000 * i, 1, 1.0, None, None, False)
            for i in range(1, 7)]
    rows += [("r", "m", "none", "e7", 0, "refused", "truncated", False, 50, 7000, 1, 1.0, None, None, False)]
    rows += [("r", "m", "bar", f"e{i}", 0, "refused", "refused", True, 0, 1000 * i, 1, 1.0, None, None, False)
             for i in range(1, 8)]
    th = tables.thinking(_records(rows)).set_index("condition")
    assert (th.loc["none", "censored"], th.loc["none", "n"]) == (1, 6)
    assert th.loc["none", "slope_per_1k"] == pytest.approx(1.0)  # the truncated sample's count left out
    assert th.loc["none", "slope_with_censored_per_1k"] > 1.0  # and kept in the sensitivity line
    assert not th.loc["bar", "measured"] and math.isnan(th.loc["bar", "slope_per_1k"]) and math.isnan(th.loc["bar", "slope_p"])
    diff = tables.thinking_slope_differences(_records(rows)).iloc[0]
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
