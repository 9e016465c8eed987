"""Simulated runs with replicates nested in episodes: what the suite checks the inference against,
the power table of the README (`python -m analysis.simulate`), and the coverage and level table
(`python -m analysis.simulate --coverage`).

An episode's replicates share a chance of success drawn from a beta distribution whose intraclass
correlation is `icc` (mean m, a + b = 1/icc - 1), so replicates of one episode agree more often than
independent samples would. Two arms on the same episodes each draw their own chance per episode:
a condition changes the prompt, which helps some episodes and hurts others even when it changes
nothing on average; that is the null the paired test and the gate must hold.

Per-episode paired differences come in two kinds (`paired_differences`): `sparse`, greedy decoding's
picture, where most episodes give the same answer in both arms (each differs with chance 0.125: -1
with 0.1, +1 with 0.025; the laptop run's limit cells had 7 of 32 episodes differ), and `dense`,
5 sampled replicates per arm at within-episode correlation 0.5 (accuracy 0.7 -> 0.55), where most
episodes differ by a fraction. Thinking runs (`thinking_runs`) have a true slope of 1 thinking token
per prompt token, an episode effect shared by both arms (within-episode correlation 0.5) and a
token cap that cuts a chosen share of the samples.
"""
from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from analysis import slopes, stats

ICC = 0.5
REPLICATES = 5
SIM_DRAWS = 5000  # weightings per Gaffke bound in the coverage runs (a report takes more: its Monte Carlo error is smaller)


def outcomes(rng: np.random.Generator, episodes: int, replicates: int, mean: float, icc: float = ICC) -> np.ndarray:
    """[episodes, replicates] of 0/1, replicates correlated `icc` within an episode."""
    total = 1 / icc - 1
    chance = rng.beta(mean * total, (1 - mean) * total, size=episodes) if 0 < mean < 1 else np.full(episodes, mean)
    return (rng.random((episodes, replicates)) < chance[:, None]).astype(float)


def paired_differences(rng: np.random.Generator, runs: int, episodes: int, kind: str) -> tuple[np.ndarray, float]:
    """([runs, episodes] per-episode differences condition - baseline, their true mean) of one kind
    (the module's docstring)."""
    if kind == "sparse":
        u = rng.random((runs, episodes))
        return np.where(u < 0.1, -1.0, np.where(u < 0.125, 1.0, 0.0)), -0.075
    if kind == "dense":
        arm = [outcomes(rng, runs * episodes, REPLICATES, m).mean(axis=1).reshape(runs, episodes) for m in (0.7, 0.55)]
        return arm[1] - arm[0], -0.15
    raise ValueError(f"kind must be sparse or dense, got {kind!r}")


def difference_coverage(reps: int, episodes: int, kind: str, *, method: str = "bounded", seed: int = 0) -> tuple[float, float]:
    """(share of simulated runs whose interval on the mean paired difference covers the truth, share
    of zero-width intervals): `bounded` is stats.paired's (Gaffke's bounds on [-1, 1], vectorised
    over the runs), `mean_interval` the t / bootstrap interval (no interval counts as a miss)."""
    d, truth = paired_differences(np.random.default_rng(seed), reps, episodes, kind)
    if method == "bounded":
        low, high = stats.gaffke_bounds(d, -1.0, 1.0, draws=SIM_DRAWS)
    elif method == "mean_interval":
        low, high = np.array([(e.low, e.high) for e in map(stats.mean_interval, d)]).T
    else:
        raise ValueError(f"method must be bounded or mean_interval, got {method!r}")
    return float(np.mean((low <= truth) & (truth <= high))), float(np.mean(high - low == 0))


def balanced_difference_coverage(reps: int, episodes: int, *, seed: int = 0) -> float:
    """Coverage of stats.paired's interval on the balanced-accuracy difference (strata weighted
    equally): `episodes` limit episodes with sparse differences and as many control episodes with
    dense ones."""
    rng = np.random.default_rng(seed)
    (sparse, t1), (dense, t2) = (paired_differences(rng, reps, episodes, k) for k in ("sparse", "dense"))
    low, high = stats.gaffke_bounds(np.hstack([sparse, dense]), -1.0, 1.0, strata=np.repeat([0, 1], episodes), draws=SIM_DRAWS)
    truth = (t1 + t2) / 2
    return float(np.mean((low <= truth) & (truth <= high)))


def pass_k_coverage(reps: int, episodes: int, *, mean: float = 0.9, seed: int = 0) -> float:
    """Coverage of pass^1's interval (stats.pass_hat_k: Gaffke's bounds on [0, 1]) at true accuracy
    `mean`, 5 replicates per episode at within-episode correlation 0.5: most episodes all right."""
    rng = np.random.default_rng(seed)
    values = outcomes(rng, reps * episodes, REPLICATES, mean).mean(axis=1).reshape(reps, episodes)
    low, high = stats.gaffke_bounds(values, 0.0, 1.0, draws=SIM_DRAWS)
    return float(np.mean((low <= mean) & (mean <= high)))


SKEWED = {  # per-episode values of unknown distribution: an attention share near 0, thinking counts with a long tail
    "attention share": (lambda rng, size: rng.beta(0.9, 29.1, size), 0.03, (0.0, 1.0)),
    "thinking tokens": (lambda rng, size: rng.lognormal(6.0, 0.5, size), float(np.exp(6.125)), (0.0, np.inf)),
}


def mean_coverage(reps: int, episodes: int, kind: str, *, seed: int = 0) -> float:
    """Coverage of stats.mean_interval (bootstrap-t) on skewed per-episode values of a kind of SKEWED."""
    draw, truth, within = SKEWED[kind]
    rng = np.random.default_rng(seed)
    hits = 0
    for row in draw(rng, (reps, episodes)):
        e = stats.mean_interval(row, within=within)
        hits += e.low <= truth <= e.high
    return hits / reps


SHIFTS = {  # per-episode shifts in log-odds (true shift -0.4): symmetric, heavy-tailed, skewed (lognormal, skewness 6)
    "symmetric": lambda rng, size: rng.normal(-0.4, 0.3, size),
    "heavy-tailed": lambda rng, size: -0.4 + 0.3 * rng.standard_t(3, size),
    "skewed": lambda rng, size: -0.4 + 0.3 * (rng.lognormal(0, 1, size) - np.exp(0.5)),
}


def shift_coverage(reps: int, episodes: int, kind: str, *, seed: int = 0) -> float:
    """Coverage of stats.shift_interval (subset means) on per-episode log-odds shifts of a kind of SHIFTS;
    NaN where it gives no interval (below 6 episodes: no exact 95% interval exists)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for row in SHIFTS[kind](rng, (reps, episodes)):
        e = stats.shift_interval(row)
        if np.isnan(e.low):
            return float("nan")
        hits += e.low <= -0.4 <= e.high
    return hits / reps


SLOPE = 1.0  # thinking tokens per prompt token in thinking_runs
NOISE = 500.0  # thinking tokens: the sd of the episode effect and of each sample's own noise


def thinking_runs(rng: np.random.Generator, episodes: int, *, truncated: float = 0.0, replicates: int = 3,
                  slope_b: float = SLOPE) -> dict[str, np.ndarray]:
    """One simulated run of two arms on the same episodes: prompt tokens x (the bar adds 40 to arm 1's),
    thinking y = 300 + slope x + episode effect + noise, cut at the token cap that cuts a `truncated`
    share of the samples on average (cut samples show the cap: a lower bound); keys x, y, cut, arm, episode."""
    x0 = rng.uniform(500, 4000, episodes)
    arm = np.tile(np.repeat([0, 1], replicates), episodes)
    episode = np.repeat(np.arange(episodes), 2 * replicates)
    x = x0[episode] + 40 * arm
    y = 300 + np.where(arm == 1, slope_b, SLOPE) * x + rng.normal(0, NOISE, episodes)[episode] + rng.normal(0, NOISE, len(x))
    cap = _cap(truncated)
    return {"x": x, "y": np.minimum(y, cap), "cut": y >= cap, "arm": arm, "episode": episode}


@functools.cache
def _cap(truncated: float) -> float:
    """The token cap above which a `truncated` share of thinking_runs' samples falls (from a large draw)."""
    if truncated <= 0:
        return np.inf
    y = 300 + SLOPE * np.random.default_rng(12345).uniform(500, 4000, 200_000) + np.random.default_rng(54321).normal(0, NOISE * 2**0.5, 200_000)
    return float(np.quantile(y, 1 - truncated))


def slope_estimates(reps: int, episodes: int, truncated: float, *, censored: bool = True, seed: int = 0) -> np.ndarray:
    """The baseline arm's thinking slope in `reps` simulated runs: slopes.fit_slope with the cut samples
    censored, or (censored=False) with them left out, as the report did before the censored fit."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        r = thinking_runs(rng, episodes, truncated=truncated)
        a = r["arm"] == 0
        keep = a if censored else a & ~r["cut"]
        out.append(slopes.fit_slope(r["x"][keep], r["y"][keep], r["episode"][keep], cut=r["cut"][keep] if censored else None).slope)
    return np.array(out)


def slope_difference_rejections(reps: int, episodes: int, *, truncated: float = 0.0, alpha: float = 0.05,
                                seed: int = 0) -> float:
    """Share of simulated runs with no slope difference between the arms in which slopes.slope_difference
    rejects at `alpha`: the test's level."""
    rng = np.random.default_rng(seed)
    rejected = 0
    for _ in range(reps):
        r = thinking_runs(rng, episodes, truncated=truncated)
        rejected += slopes.slope_difference(r["x"], r["y"], r["arm"], r["episode"], cut=r["cut"]).p_value < alpha
    return rejected / reps


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
        res = stats.paired(a, b, ids, flips=flips, draws=SIM_DRAWS)  # the bound is not what is measured here
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


def coverage_table(reps: int, sizes: tuple[int, ...] = (4, 8, 16, 20, 32)) -> list[str]:
    """The README's tables: coverage of each interval per number of episodes, and the level of the
    slope-difference test."""
    rows = [("paired difference, sparse (Gaffke)", lambda n: difference_coverage(reps, n, "sparse", seed=n)[0]),
            ("paired difference, dense (Gaffke)", lambda n: difference_coverage(reps, n, "dense", seed=n)[0]),
            ("balanced-accuracy difference (Gaffke, strata)", lambda n: balanced_difference_coverage(reps, n, seed=n)),
            ("pass^1 at accuracy 0.9 (Gaffke)", lambda n: pass_k_coverage(reps, n, seed=n)),
            ("balanced accuracy (Korn-Graubard)", lambda n: headline_coverage(reps, episodes=n, seed=n)),
            *((f"mean {kind} (bootstrap-t)", lambda n, k=kind: mean_coverage(reps, n, k, seed=n)) for kind in SKEWED),
            *((f"paired log-odds shift, {kind} (subset means)", lambda n, k=kind: shift_coverage(reps, n, k, seed=n))
              for kind in SHIFTS)]
    out = ["| interval: coverage at 95% | " + " | ".join(f"{n} episodes" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    out += [f"| {name} | " + " | ".join(_share(f(n)) for n in sizes) + " |" for name, f in rows]
    levels = (6, 12, 24)
    out += ["", "| slope-difference test: rejections at 0.05 under no effect | "
            + " | ".join(f"{n} episodes" for n in levels) + " |", "|---|" + "---|" * len(levels)]
    out += [f"| {t:.0%} of the samples truncated | "
            + " | ".join(f"{slope_difference_rejections(reps, n, truncated=t, seed=n):.3f}" for n in levels) + " |"
            for t in (0.0, 0.47)]
    return out


def _share(x: float) -> str:
    return "no interval" if np.isnan(x) else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[10, 20, 40, 80], help="paired episodes")
    parser.add_argument("--drops", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5])
    parser.add_argument("--base", type=float, default=0.8, help="baseline accuracy")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--reps", type=int, default=400, help="simulated comparisons per cell")
    parser.add_argument("--coverage", action="store_true",
                        help="print the coverage of each interval and the slope-difference test's level instead")
    args = parser.parse_args(argv)
    if args.coverage:
        print(f"Coverage of the report's 95% intervals and level of the slope-difference test at 0.05, {args.reps} "
              "simulated runs per cell (analysis.simulate's docstring: the runs and their truth)\n")
        print("\n".join(coverage_table(args.reps)))
        return 0
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
