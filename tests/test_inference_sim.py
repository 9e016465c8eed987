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
    (alpha 0.05, no minimum effect, so the test alone decides)."""
    rng = np.random.default_rng(seed)
    n = episodes * simulate.REPLICATES
    keys = pd.DataFrame({"condition": "status_tail", "replicate": np.tile(np.arange(simulate.REPLICATES), episodes),
                         "episode_id": np.repeat([f"e{i}" for i in range(episodes)], simulate.REPLICATES)})
    keys["pair_key"] = keys["episode_id"] if clustered else keys["episode_id"] + "/" + keys["replicate"].astype(str)
    failed = 0
    for _ in range(reps):
        base, cand = (keys.assign(correct=simulate.outcomes(rng, episodes, simulate.REPLICATES, 0.8).ravel().astype(bool))
                      for _ in range(2))
        tests = regress.gate_tests(base, cand, ["status_tail"], alpha=0.05, min_effect=0.0, correction="holm")
        assert tests[0].n == n
        failed += any(t.regression for t in tests)
    return failed / reps


def test_gate_holds_its_level_under_no_effect(monkeypatch):
    import gc

    # statsmodels' Holm calls gc.collect() on every call: most of this simulation's time, no part of the gate
    monkeypatch.setattr(gc, "collect", lambda *a: 0)
    assert _gate_rejections(150, clustered=True) <= 0.06
    # 50 samples taken as 50 episodes: Monte Carlo flips, fewer of them to keep this quick
    monkeypatch.setattr(stats, "MONTE_CARLO_FLIPS", 999)
    assert _gate_rejections(100, clustered=False) > 0.06
