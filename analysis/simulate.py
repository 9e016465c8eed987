"""Simulated runs with replicates nested in episodes: what the suite checks the inference against,
and the power table of the README (`python -m analysis.simulate`).

An episode's replicates share a chance of success drawn from a beta distribution whose intraclass
correlation is `icc` (mean m, a + b = 1/icc - 1), so replicates of one episode agree more often than
independent samples would. Two arms on the same episodes each draw their own chance per episode:
a condition changes the prompt, which helps some episodes and hurts others even when it changes
nothing on average; that is the null the paired test and the gate must hold.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from analysis import stats

ICC = 0.5
REPLICATES = 5


def outcomes(rng: np.random.Generator, episodes: int, replicates: int, mean: float, icc: float = ICC) -> np.ndarray:
    """[episodes, replicates] of 0/1, replicates correlated `icc` within an episode."""
    total = 1 / icc - 1
    chance = rng.beta(mean * total, (1 - mean) * total, size=episodes) if 0 < mean < 1 else np.full(episodes, mean)
    return (rng.random((episodes, replicates)) < chance[:, None]).astype(float)


def headline_coverage(reps: int, *, episodes: int = 10, replicates: int = REPLICATES, means: tuple[float, float] = (0.7, 0.85),
                      icc: float = ICC, clustered: bool = True, seed: int = 0) -> float:
    """Share of simulated runs whose balanced-accuracy interval covers the true value: `episodes`
    limit and as many control episodes, with true accuracies `means`. clustered=False treats every
    sample as its own episode (the mistake the suite guards against)."""
    rng = np.random.default_rng(seed)
    truth = sum(means) / 2
    hits = 0
    ids = np.repeat(np.arange(episodes), replicates) if clustered else np.arange(episodes * replicates)
    for _ in range(reps):
        classes = [stats.proportion(outcomes(rng, episodes, replicates, m, icc).ravel(), ids) for m in means]
        b = stats.balanced(*classes)
        hits += b.low <= truth <= b.high
    return hits / reps


def paired_rejections(reps: int, *, episodes: int = 10, replicates: int = REPLICATES, base: float = 0.8, drop: float = 0.0,
                      icc: float = ICC, alpha: float = 0.05, alternative: str = "two-sided", clustered: bool = True,
                      flips: int | None = None, seed: int = 0) -> float:
    """Share of simulated paired comparisons (baseline accuracy `base`, the condition `drop` lower)
    that stats.paired rejects at `alpha`: the false-positive rate at drop 0, the power above it."""
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(episodes), replicates) if clustered else np.arange(episodes * replicates)
    rejected = 0
    for _ in range(reps):
        a = outcomes(rng, episodes, replicates, base, icc).ravel()
        b = outcomes(rng, episodes, replicates, base - drop, icc).ravel()
        res = stats.paired(a, b, ids, flips=flips)
        rejected += (res.p_two_sided if alternative == "two-sided" else res.p_drop) < alpha
    return rejected / reps


def power_table(sizes: list[int], drops: list[float], *, reps: int, base: float, alpha: float, seed: int = 0,
                power: float = 0.8) -> list[tuple[int, float | None, dict[float, float]]]:
    """Per number of paired episodes: the smallest drop of `drops` the one-sided gate test detects
    with at least `power` (None: none of them), and the power at each drop."""
    rows = []
    for n in sizes:
        at = {d: paired_rejections(reps, episodes=n, base=base, drop=d, alpha=alpha, alternative="less", flips=999,
                                   seed=seed) for d in drops}
        rows.append((n, next((d for d in drops if at[d] >= power), None), at))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[10, 20, 40, 80], help="paired episodes")
    parser.add_argument("--drops", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5])
    parser.add_argument("--base", type=float, default=0.8, help="baseline accuracy")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--reps", type=int, default=400, help="simulated comparisons per cell")
    args = parser.parse_args(argv)
    print(f"Power of the one-sided sign-flip gate (alpha {args.alpha}, one test), {REPLICATES} replicates per episode, "
          f"within-episode correlation {ICC}, baseline accuracy {args.base}, {args.reps} simulated runs per cell\n")
    rows = power_table(args.episodes, args.drops, reps=args.reps, base=args.base, alpha=args.alpha)
    print("| paired episodes | drop detected at 80% | " + " | ".join(f"power at -{d:g}" for d in args.drops) + " |")
    print("|---|---|" + "---|" * len(args.drops))
    for n, smallest, at in rows:
        print(f"| {n} | {'none of these' if smallest is None else f'{smallest:g}'} | "
              + " | ".join(f"{at[d]:.2f}" for d in args.drops) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
