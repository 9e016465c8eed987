"""`python benchmarks/bf16.py [--repeats N] OVERRIDES...`: the hf backend in float32 and in bfloat16 on
the same grid (the default one unless overridden), in one process and in turns (float32, bfloat16,
float32, ...: a drift in the machine's speed falls on both). Prints a Markdown table: each arm's
outcome counts per dtype, how many texts are identical (samples paired by episode, condition and
replicate), generation seconds of every run and the median ratio bfloat16 / float32, the linear
path each ran, the load average before and after. Writes JSON beside it (`--out`).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from statistics import median

from harness.backends import make_backend
from harness.config.compose import compose_config
from harness.tools.timing import timed_run

DTYPES = ("float32", "bfloat16")


def _key(r: dict) -> tuple:
    return r["episode_id"], r["condition"], r["replicate"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("results/bench/bf16.json"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    cfgs = {d: compose_config(["backend=hf", f"backend.dtype={d}", "run.progress=false", "run.report=false",
                               *args.overrides]) for d in DTYPES}
    backends = {d: make_backend(cfg.model, cfg.backend) for d, cfg in cfgs.items()}
    runs: dict[str, list[dict]] = {d: [] for d in DTYPES}
    with tempfile.TemporaryDirectory() as tmp:
        for turn in range(args.repeats):
            for d in DTYPES:
                runs[d].append(timed_run(cfgs[d], backends[d], Path(tmp) / f"{d}-{turn}"))
    load_after = os.getloadavg()[0]
    records = {d: {_key(r): r for r in runs[d][0]["records"]} for d in DTYPES}
    f32, bf16 = records["float32"], records["bfloat16"]
    counts = {d: Counter((r["condition"], r["label"]) for r in records[d].values()) for d in DTYPES}
    generate = {d: [run["generate_s"] for run in runs[d]] for d in DTYPES}
    summary = {
        "overrides": args.overrides, "repeats": args.repeats, "load_before": load_before, "load_after": load_after,
        "backend": {d: backends[d].describe() for d in DTYPES}, "generate_s": generate,
        "bf16_over_f32": median(generate["bfloat16"]) / median(generate["float32"]),
        "samples": len(f32), "identical": sum(bf16.get(k, {}).get("text") == r["text"] for k, r in f32.items()),
        "labels_moved": [list(k) for k in sorted(f32) if bf16.get(k, {}).get("label") != f32[k]["label"]],
        "counts": {d: {f"{c}/{label}": n for (c, label), n in sorted(counts[d].items())} for d in DTYPES}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print("| arm | label | float32 | bfloat16 |\n|---|---|---|---|")
    for arm, label in sorted(counts["float32"].keys() | counts["bfloat16"].keys()):
        print(f"| {arm} | {label} | {counts['float32'][arm, label]} | {counts['bfloat16'][arm, label]} |")
    print(f"\nidentical texts: {summary['identical']} of {summary['samples']}; labels moved: {len(summary['labels_moved'])}")
    times = "; ".join(d + " " + " ".join(f"{t:.1f}" for t in generate[d]) for d in DTYPES)
    print(f"generation s: {times}"
          + f"; bfloat16 / float32 (medians) {summary['bf16_over_f32']:.2f}x")
    linear = ", ".join(f"{d} {backends[d].describe()['linear']}" for d in DTYPES)
    print(f"linear: {linear}; "
          f"threads {backends['float32'].describe()['threads']}; load average {load_before:.1f} -> {load_after:.1f}; "
          f"JSON: {args.out}")


if __name__ == "__main__":
    main()
