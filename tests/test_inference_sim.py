"""Seeded simulations of runs with 5 replicates per episode and within-episode correlation 0.5: the
headline interval covers, and the paired test and the gate hold their level under no effect. Each
check is run beside the same computation with the clustering removed (every sample its own episode),
which must fail it: that is what makes the check a check."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import regress, simulate, stats


def test_balanced_accuracy_interval_covers_with_correlated_replicates():
    assert simulate.headline_coverage(600, seed=1) >= 0.93
    assert simulate.headline_coverage(600, seed=1, clustered=False) < 0.93  # replicates taken as independent


def test_paired_test_holds_its_level_under_no_effect():
    assert simulate.paired_rejections(200, seed=2) <= 0.06
    assert simulate.paired_rejections(100, seed=2, clustered=False, flips=999) > 0.06


def _gate_rejections(reps: int, *, clustered: bool, episodes: int = 10, seed: int = 3) -> float:
    """Share of simulated candidate runs, no worse than the baseline on average, that the gate fails
    (alpha 0.05, no minimum effect, so the test alone decides): half the episodes limit cells, half
    control cells, so it tests balanced accuracy, limit and control cells."""
    rng = np.random.default_rng(seed)
    n = episodes * simulate.REPLICATES
    keys = pd.DataFrame({"condition": "status_tail", "replicate": np.tile(np.arange(simulate.REPLICATES), episodes),
                         "episode_id": np.repeat([f"e{i}" for i in range(episodes)], simulate.REPLICATES),
                         "expected": np.repeat(["refused", "complied"], n // 2), "label": "graded"})
    keys["pair_key"] = keys["episode_id"] if clustered else keys["episode_id"] + "/" + keys["replicate"].astype(str)
    failed = 0
    for _ in range(reps):
        base, cand = (keys.assign(correct=simulate.outcomes(rng, episodes, simulate.REPLICATES, 0.8).ravel().astype(bool))
                      for _ in range(2))
        tests = regress.gate_tests(base, cand, ["status_tail"], alpha=0.05, min_effect=0.0, correction="holm")
        assert [t.cell for t in tests] == ["balanced", "limit", "control"] and tests[0].n == n
        failed += any(t.regression for t in tests)
    return failed / reps


def test_gate_holds_its_level_under_no_effect(monkeypatch):
    import gc

    # statsmodels' Holm calls gc.collect() on every call: most of this simulation's time, no part of the gate
    monkeypatch.setattr(gc, "collect", lambda *a: 0)
    monkeypatch.setattr(stats, "BOUND_DRAWS", 0)  # the fewest weightings: the drop's interval is not what is measured here
    assert _gate_rejections(150, clustered=True) <= 0.06
    # 50 samples taken as 50 episodes: Monte Carlo flips, fewer of them to keep this quick
    monkeypatch.setattr(stats, "MONTE_CARLO_FLIPS", 999)
    assert _gate_rejections(100, clustered=False) > 0.06


SIZES = (4, 8, 16, 20, 32)


def test_paired_difference_interval_covers_at_every_size_and_is_never_zero_width():
    """stats.paired's interval (Gaffke's bound on per-episode differences in [-1, 1]) against runs whose
    truth was built: sparse differences (most episodes agree, as under greedy decoding) and dense ones
    (sampled replicates). The t / bootstrap-t interval on the same differences fails the same check."""
    for kind in ("sparse", "dense"):
        for n in SIZES:
            covered, zero_width = simulate.difference_coverage(300, n, kind, seed=n)
            assert covered >= 0.93 and zero_width == 0, (kind, n, covered, zero_width)
    assert simulate.difference_coverage(300, 4, "sparse", seed=4, method="mean_interval")[0] < 0.93
    assert simulate.difference_coverage(300, 16, "sparse", seed=16, method="mean_interval")[0] < 0.93


def test_balanced_difference_pass_k_and_the_headline_cover_at_every_size():
    for n in SIZES:
        assert simulate.balanced_difference_coverage(200, n, seed=n) >= 0.93, n
        assert simulate.pass_k_coverage(200, n, seed=n) >= 0.93, n
        assert simulate.headline_coverage(150, episodes=n, seed=n) >= 0.93, n


def test_thinking_slope_is_recovered_with_half_the_samples_truncated():
    """True slope 1 thinking token per prompt token; 47% of the samples cut at the token cap. The
    censored fit recovers it within 5% (mean of 150 runs of 24 episodes); leaving the cut samples out,
    as the report did before, finds a slope 30-40% too flat."""
    censored = simulate.slope_estimates(150, 24, 0.47, seed=1)
    assert abs(np.mean(censored) - simulate.SLOPE) < 0.05 * simulate.SLOPE, np.mean(censored)
    assert np.mean(simulate.slope_estimates(150, 24, 0.47, censored=False, seed=1)) < 0.8 * simulate.SLOPE


def _sandwich_rejections(reps: int, episodes: int, seed: int) -> float:
    """The slope-difference test with the usual clustered errors (CR1 sandwich, t on episodes - 1),
    no sample cut: the test the report used before, on the same simulated runs."""
    import statsmodels.api as sm

    rng = np.random.default_rng(seed)
    rejected = 0
    for _ in range(reps):
        r = simulate.thinking_runs(rng, episodes)
        design = np.column_stack([np.ones_like(r["x"]), r["x"], r["arm"], r["x"] * r["arm"]])
        fit = sm.OLS(r["y"], design).fit(cov_type="cluster", cov_kwds={"groups": r["episode"]}, use_t=True)
        rejected += fit.pvalues[3] < 0.05
    return rejected / reps


def test_slope_difference_test_holds_its_level_at_few_episodes():
    """No slope difference in truth, 6 to 24 episodes, with and without truncation: the jackknife test
    rejects about 5% (at most 8% over 250 runs); the sandwich rejects about 15% at 6 episodes."""
    for episodes in (6, 12, 24):
        for truncated in (0.0, 0.47):
            level = simulate.slope_difference_rejections(250, episodes, truncated=truncated, seed=episodes)
            assert level <= 0.08, (episodes, truncated, level)
    assert _sandwich_rejections(250, 6, seed=6) > 0.08


def test_shift_interval_covers_where_the_differences_are_symmetric_and_gives_none_below_6_episodes():
    """stats.shift_interval (the propensity section's interval on a log-odds shift) against runs whose truth
    was built: exact where each episode's difference is symmetric about the shift (normal, t with 3 df);
    at 4 episodes no exact 95% interval exists, and it gives none. (Skewed differences: the README's table.)"""
    for kind in ("symmetric", "heavy-tailed"):
        assert np.isnan(simulate.shift_coverage(50, 4, kind, seed=4))
        for n in (6, 8, 16, 20, 32):
            assert simulate.shift_coverage(800, n, kind, seed=n) >= 0.93, (kind, n)  # 800 runs: 0.93 is 2.6 se below 0.95
