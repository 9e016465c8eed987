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


def test_wilson_by_hand_and_against_statsmodels():
    # 9/10: centre (p + z^2/2n) / (1 + z^2/n), half-width z/(1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2)
    p, n = 0.9, 10
    centre = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z / (1 + Z**2 / n) * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2))
    assert stats.wilson(9, 10) == pytest.approx((0.9, centre - half, centre + half))
    # 0/10: the interval is [0, z^2 / (n + z^2)] = [0, 0.2775]
    assert stats.wilson(0, 10) == pytest.approx((0.0, 0.0, Z**2 / (10 + Z**2)))
    assert stats.wilson(0, 10)[2] == pytest.approx(0.2775, abs=1e-4)
    for k, m in [(3, 7), (50, 100), (1, 200)]:
        assert stats.wilson(k, m)[1:] == pytest.approx(proportion_confint(k, m, method="wilson"))
    assert all(math.isnan(x) for x in stats.wilson(0, 0))


def test_exact_mcnemar_by_hand():
    # discordant 5 vs 1: two-sided p = 2 * P(X <= 1 | Bin(6, 1/2)) = 2 * 7/64; one-sided P(X >= 5) = 7/64
    assert stats.mcnemar_exact(5, 1) == pytest.approx(14 / 64)
    assert stats.mcnemar_drop(5, 1) == pytest.approx(7 / 64)
    assert stats.mcnemar_drop(1, 5) == pytest.approx(63 / 64)  # the candidate got better: no evidence of a drop
    assert stats.mcnemar_exact(3, 3) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0 and stats.mcnemar_drop(0, 0) == 1.0
    assert stats.mcnemar_drop(10, 0) == pytest.approx(0.5 ** 10)
    for b, c in [(12, 4), (0, 9), (30, 18)]:
        assert stats.mcnemar_exact(b, c) == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue)


def test_paired_counts_on_a_hand_table():
    a = np.array([1, 1, 1, 0, 0, 1], bool)
    b = np.array([1, 0, 0, 0, 1, 1], bool)
    res = stats.paired(a, b, np.arange(6))
    assert (res.n, res.only_a, res.only_b) == (6, 2, 1)
    assert (res.acc_a, res.acc_b, res.diff) == pytest.approx((4 / 6, 3 / 6, -1 / 6))
    assert res.p_two_sided == pytest.approx(1.0)  # 2 * P(X <= 1 | Bin(3, 1/2)) = 2 * 4/8
    assert res.p_drop == pytest.approx(0.5)  # P(X >= 2 | Bin(3, 1/2))
    assert res.diff_low <= res.diff <= res.diff_high
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired(a, b[:3], np.arange(6))


def test_cluster_bootstrap_matches_the_normal_interval_for_independent_pairs():
    rng = np.random.default_rng(7)
    n = 2000
    a = rng.random(n) < 0.8
    b = rng.random(n) < 0.6
    diff, low, high = stats.cluster_bootstrap_diff(a, b, np.arange(n))
    d = b.astype(float) - a.astype(float)
    se = d.std(ddof=1) / math.sqrt(n)
    assert diff == pytest.approx(d.mean())
    assert low == pytest.approx(diff - Z * se, abs=0.006) and high == pytest.approx(diff + Z * se, abs=0.006)


def test_cluster_bootstrap_resamples_episodes_not_samples():
    rng = np.random.default_rng(3)
    n, k = 300, 4
    a, b = rng.random(n) < 0.7, rng.random(n) < 0.5
    one = stats.cluster_bootstrap_diff(a, b, np.arange(n))
    # every episode answered identically by k replicates: no new information
    a4, b4 = np.repeat(a, k), np.repeat(b, k)
    clustered = stats.cluster_bootstrap_diff(a4, b4, np.repeat(np.arange(n), k))
    naive = stats.cluster_bootstrap_diff(a4, b4, np.arange(n * k))
    width = lambda r: r[2] - r[1]  # noqa: E731
    assert clustered[0] == pytest.approx(one[0])
    assert width(clustered) == pytest.approx(width(one), rel=0.15)
    assert width(naive) == pytest.approx(width(one) / math.sqrt(k), rel=0.15)  # too narrow by sqrt(k)


def test_cluster_bootstrap_degenerate_cases():
    a = np.array([1, 1, 1, 1], bool)
    b = np.array([0, 0, 0, 0], bool)
    assert stats.cluster_bootstrap_diff(a, b, np.array([0, 0, 1, 1])) == (-1.0, -1.0, -1.0)
    diff, low, high = stats.cluster_bootstrap_diff(a, b, np.zeros(4))  # one episode: no interval
    assert diff == -1.0 and math.isnan(low) and math.isnan(high)


def test_pass_hat_k_by_hand():
    c, n = np.array([4, 3, 0, 2]), np.array([4, 4, 4, 4])
    assert stats.pass_hat_k(c, n, 1) == pytest.approx((1 + 0.75 + 0 + 0.5) / 4)
    # C(4,2)/C(4,2) = 1, C(3,2)/6 = 1/2, 0, C(2,2)/6 = 1/6
    assert stats.pass_hat_k(c, n, 2) == pytest.approx((1 + 0.5 + 0 + 1 / 6) / 4)
    assert stats.pass_hat_k(c, n, 4) == pytest.approx(0.25)  # only the episode that never failed
    assert math.isnan(stats.pass_hat_k(c, n, 5)) and math.isnan(stats.pass_hat_k(c[:0], n[:0], 1))


def test_bootstrap_location():
    assert stats.bootstrap_location(np.zeros(10), "median") == (0.0, 0.0, 0.0)
    assert stats.bootstrap_location(np.array([7.0]), "mean") == (7.0, 7.0, 7.0)
    assert all(math.isnan(v) for v in stats.bootstrap_location(np.array([np.nan]), "mean"))
    est, low, high = stats.bootstrap_location(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, np.nan]), "median")
    assert est == 5 and 2 <= low <= 5 <= high <= 8
    x = np.random.default_rng(0).normal(100, 15, 400)
    est, low, high = stats.bootstrap_location(x, "mean")
    t_low, t_high = sps.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sps.sem(x))
    assert est == pytest.approx(x.mean())
    assert low == pytest.approx(t_low, abs=0.3) and high == pytest.approx(t_high, abs=0.3)
    with pytest.raises(KeyError):
        stats.bootstrap_location(x, "mode")


def test_ols_slope_against_linregress():
    rng = np.random.default_rng(1)
    x = rng.uniform(500, 4000, 60)
    y = 0.05 * x + rng.normal(0, 20, 60)
    ref = sps.linregress(x, y)
    res = stats.ols_slope(x, y)
    t = sps.t.ppf(0.975, len(x) - 2)
    assert res.slope == pytest.approx(ref.slope)
    assert res.intercept == pytest.approx(ref.intercept)
    assert (res.low, res.high) == pytest.approx((ref.slope - t * ref.stderr, ref.slope + t * ref.stderr))
    assert res.p_value == pytest.approx(ref.pvalue) and res.n == 60
    exact = stats.ols_slope(np.array([1, 2, 3, 4.0]), np.array([3, 5, 7, 9.0]))
    assert (exact.slope, exact.intercept) == pytest.approx((2.0, 1.0))
    flat = stats.ols_slope(np.array([1, 2, 3, 4.0]), np.zeros(4))  # the status-bar arm's hoped-for shape
    assert (flat.slope, flat.low, flat.high) == pytest.approx((0.0, 0.0, 0.0))
    assert math.isnan(stats.ols_slope(np.full(5, 3.0), np.arange(5.0)).slope)  # context length does not vary


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
    assert (t["acc_low"], t["acc_high"]) == pytest.approx(proportion_confint(3, 6, method="wilson"))
    err = tables.errors(_records(rows))
    assert err[["kind", "count", "n"]].values.tolist() == [["template: ValueError", 1, 6]]
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
    assert (comp["baseline"], comp["condition"], comp["n"], comp["only_a"], comp["only_b"]) == ("none", "bar", 8, 2, 0)
    assert comp["diff"] == pytest.approx(4 / 8 - 6 / 8)
    pk = tables.pass_k(df).set_index("condition")
    assert pk.loc["none", "pass^2"] == pytest.approx(3 / 4)  # 3 episodes always right
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
    assert th.loc["bar", ["median_low", "median_high"]].tolist() == [5.0, 5.0]


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
