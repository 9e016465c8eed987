"""`python benchmarks/contention.py [--repeats N] [--variants auto two one] OVERRIDES...`: the whole
`python -m harness.run` command timed on a quiet machine and beside two busy processes (`while 1: pass`),
in pairs (quiet, busy, quiet, busy, ...: a drift in the machine's speed falls on both), for each thread
variant (backend.threads); wall and CPU seconds (the command's, all its threads), the busy / quiet
ratio of each pair, and the load average before and after each run. Every process (the command and
the busy loops) runs under `nice`, so on a machine shared with others their work preempts all of them alike.

Waste is what the criterion weighs (issue 42): beside two busy processes on C cores the command's fair
share is C / 3 of a core (two thirds on 2 cores), so no thread policy makes its wall time near the
quiet one; its CPU time should stay within 1.15x of the quiet CPU time (no spinning threads), and its
wall time within 1.25x of the quiet CPU time divided by that share. Prints a Markdown table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# backend.threads: 0 = the policy (free cores at load time, harness.engine.threads); 2 = torch's own default on
# a 2-core machine (one thread per core), what the hf backend did before; 1 = one thread
VARIANTS = {"auto": [], "two": ["backend.threads=2"], "one": ["backend.threads=1"]}


def timed(overrides: list[str], root: Path, name: str, busy: int) -> dict:
    loops = [subprocess.Popen(["nice", sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
    try:
        before = os.getloadavg()
        t0, cpu0 = time.perf_counter(), _children_cpu()
        proc = subprocess.run(["nice", sys.executable, "-m", "harness.run", f"run.root={root}", f"run.name={name}",
                               "run.progress=false", *overrides], capture_output=True, text=True)
        # the command alone: the busy loops are children too, but counted only once waited for (below)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        after = os.getloadavg()
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    if proc.returncode:
        sys.exit(f"contention: {name} failed:\n{proc.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "load_before": before[0], "load_after": after[0], "busy": busy}


def _children_cpu() -> float:
    """User and system CPU seconds of the children waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fair_share(cpus: int, busy: int) -> float:
    """The cores a one-thread process gets beside `busy` processes that each keep a core busy: all
    runnable threads share the CPUs alike, and one thread never gets more than a core."""
    return min(1.0, cpus / (busy + 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("results/bench/contention.json"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory(prefix="statusbench-contention-") as tmp:
        for rep in range(args.repeats):
            for variant in args.variants:
                for busy in (0, 2):
                    r = timed([*args.overrides, *VARIANTS[variant]], Path(tmp), f"{variant}-{rep}-{busy}", busy)
                    runs[variant].append(r)
                    print(f"{variant} rep {rep} busy {busy}: {r['wall_s']:.1f} s, load {r['load_before']:.2f} -> "
                          f"{r['load_after']:.2f}", flush=True)
    print("\n| threads | quiet wall s / CPU s | 2 busy: wall s / CPU s | busy / quiet wall | busy / quiet CPU (<= 1.15) | "
          "busy wall / (quiet CPU / fair share) (<= 1.25) | load avg before -> after (quiet; busy) |\n|---|---|---|---|---|---|---|")
    share = fair_share(os.cpu_count() or 1, 2)
    for variant, rs in runs.items():
        quiet, busy = [r for r in rs if not r["busy"]], [r for r in rs if r["busy"]]
        pairs = list(zip(quiet, busy))
        ratios = lambda f: " ".join(f"{f(q, b):.2f}" for q, b in pairs)  # noqa: E731
        loads = lambda xs: " ".join(f"{r['load_before']:.1f}->{r['load_after']:.1f}" for r in xs)  # noqa: E731
        times = lambda xs: " ".join(f"{r['wall_s']:.0f} / {r['cpu_s']:.0f}" for r in xs)  # noqa: E731
        print(f"| {variant} | {times(quiet)} | {times(busy)} | {ratios(lambda q, b: b['wall_s'] / q['wall_s'])} | "
              f"{ratios(lambda q, b: b['cpu_s'] / q['cpu_s'])} | {ratios(lambda q, b: b['wall_s'] / (q['cpu_s'] / share))} | "
              f"{loads(quiet)}; {loads(busy)} |")
    print(f"\nfair share beside 2 busy processes on {os.cpu_count()} CPUs: {share:.2f} of a core")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"overrides": args.overrides, "cpus": os.cpu_count(), "runs": runs}, indent=2))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
