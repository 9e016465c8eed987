"""`python benchmarks/contention.py [--repeats N] [--variants auto two one] OVERRIDES...`: the whole
`python -m harness.run` command timed on a quiet machine and beside two busy processes (`while 1: pass`),
in pairs (quiet, busy, quiet, busy, ...: a drift in the machine's speed falls on both), for each thread
variant (backend.threads); wall seconds, the busy / quiet ratio of each pair, and the load average
before and after each run. Every process (the command and the busy loops) runs under `nice`, so on a
machine shared with others their work preempts all of them alike. Prints a Markdown table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

# backend.threads: 0 = the policy (free cores at load time, harness.engine.threads); 2 = torch's own default on
# a 2-core machine (one thread per core), what the hf backend did before; 1 = one thread
VARIANTS = {"auto": [], "two": ["backend.threads=2"], "one": ["backend.threads=1"]}


def timed(overrides: list[str], root: Path, name: str, busy: int) -> dict:
    loops = [subprocess.Popen(["nice", sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
    try:
        before = os.getloadavg()
        t0 = time.perf_counter()
        proc = subprocess.run(["nice", sys.executable, "-m", "harness.run", f"run.root={root}", f"run.name={name}",
                               "run.progress=false", *overrides], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = os.getloadavg()
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    if proc.returncode:
        sys.exit(f"contention: {name} failed:\n{proc.stderr[-2000:]}")
    return {"wall_s": wall, "load_before": before[0], "load_after": after[0], "busy": busy}


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
    print("\n| threads | quiet s (each run) | 2 busy processes s (each run) | busy / quiet, per pair | "
          "median ratio | load avg before -> after (quiet; busy) |\n|---|---|---|---|---|---|")
    for variant, rs in runs.items():
        quiet, busy = [r for r in rs if not r["busy"]], [r for r in rs if r["busy"]]
        ratios = [b["wall_s"] / q["wall_s"] for q, b in zip(quiet, busy)]
        loads = lambda xs: " ".join(f"{r['load_before']:.1f}->{r['load_after']:.1f}" for r in xs)  # noqa: E731
        walls = lambda xs: " ".join(f"{r['wall_s']:.0f}" for r in xs)  # noqa: E731
        print(f"| {variant} | {walls(quiet)} | {walls(busy)} | {' '.join(f'{x:.2f}' for x in ratios)} | "
              f"{median(ratios):.2f} | {loads(quiet)}; {loads(busy)} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"overrides": args.overrides, "cpus": os.cpu_count(), "runs": runs}, indent=2))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
