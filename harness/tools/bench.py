"""`python -m harness.tools.bench [OVERRIDES...]`: what prefix sharing and batching buy, in one run.

On the embedded model and the default ablation with 4 replicates (change either with Hydra overrides):
- sampled (so replicates differ and every replicate is decoded), the naive one-sample loop
  (backend.share_prefix=false, batch 1) against ours, through the whole harness: the honest ratio of
  wall times, and whether every output is token-identical (a draw depends on its seed only); ours:
  samples/s, prefill tokens computed / requested, the harness's own overhead (time outside
  backend.generate) as a share of the wall time;
- greedy, the same two: here ours decodes identical prompts once and copies the replicates, so
  this ratio also counts the decodes it skips;
- a synthetic run of 100k records loaded into the report's DataFrame, timed;
- analysis.report and analysis.regress over synthetic runs of 20,000 and 200,000 records (the sampled
  run's records cycled), each in a child process: time, peak RSS, and how both grow (`harness/tools/scale.py`;
  `--scale only` runs just that, on a scripted run of the grid; `--scale off` skips it);
- peak RSS of the process, the hf backend's threads and why, the load average before and after;
- where vllm is installed, a peer comparison (`harness/tools/peer.py`): the same grid, greedy, through
  backend=hf and backend=vllm, generation seconds and output identity side by side (`--peer only`
  runs just that; `--peer off` skips it); `--peer-grids`, `--peer-models` and `--peer-dtypes` run it
  for every combination, one table row each.
Only ratios within one run mean anything on a shared machine. Writes a JSON file and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from analysis.load import load_records
from harness.backends import make_backend
from harness.config.compose import compose_config, user_errors
from harness.run import first_steps
from harness.rundir.layout import PROMPTS
from harness.run import execute
from harness.tools import peer, scale
from harness.tools.peer import vllm_installed
from harness.tools.timing import timed_run
from harness.rundir.store import read_jsonl
from harness.types import canonical_json

GOALS = {"prefill_ratio": 0.3, "naive_over_ours": 3.0, "overhead_share": 0.05, "load_100k_s": 10.0}


def replicates_differ(records: list[dict]) -> float:
    """Share of (episode, condition) groups whose replicates did not all produce the same text."""
    groups: dict[tuple, set[str]] = {}
    for r in records:
        groups.setdefault((r["episode_id"], r["condition"]), set()).add(r["text"])
    return sum(len(texts) > 1 for texts in groups.values()) / len(groups)


def load_100k(template: list[dict], directory: Path, n: int = 100_000) -> dict[str, float]:
    """Write n records cycled from a real run (fresh ids) and time loading them into the report's frame."""
    directory.mkdir(parents=True)
    with open(directory / "records.jsonl", "w", encoding="utf-8") as fh:
        for k in range(n):
            fh.write(canonical_json({**template[k % len(template)], "sample_id": f"synthetic-{k}"}) + "\n")
    t0 = time.perf_counter()
    df = load_records([directory])
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_records([directory])  # again: whatever the loader caches
    warm = time.perf_counter() - t0
    assert len(df) == n
    return {"records": n, "jsonl_mb": (directory / "records.jsonl").stat().st_size / 1e6, "load_s": cold, "reload_s": warm}


def table(result: dict[str, Any]) -> str:
    from tabulate import tabulate

    g, n, s, sn, load = (result[k] for k in ("greedy_ours", "greedy_naive", "sampled_ours", "sampled_naive", "load"))
    rows = [
        ["samples per arm", g["samples"], "", f"grid x replicates ({result['overrides'] or 'defaults'})"],
        ["sampled wall s: naive loop / ours", f"{sn['wall_s']:.1f} / {s['wall_s']:.1f}", "", "every replicate decoded"],
        ["naive / ours wall-time ratio (sampled)", f"{result['naive_over_ours_sampled']:.2f}", f">= {GOALS['naive_over_ours']}",
         _identical(result, "sampled", s["samples"])],
        ["greedy wall s: naive loop / ours", f"{n['wall_s']:.1f} / {g['wall_s']:.1f}", "", ""],
        ["naive / ours ratio (greedy: ours decodes replicates once, copies)", f"{result['naive_over_ours']:.2f}", "",
         _identical(result, "greedy", g["samples"])],
        ["samples/s: naive, ours (sampled); naive, ours (greedy)",
         f"{sn['samples_per_s']:.3f}, {s['samples_per_s']:.3f}; {n['samples_per_s']:.3f}, {g['samples_per_s']:.3f}", "", ""],
        ["prefill computed / requested (sampled)", f"{s['prefill_computed']} / {s['prefill_requested']} = {s['prefill_ratio']:.3f}",
         f"<= {GOALS['prefill_ratio']}", f"greedy: {g['prefill_ratio']:.3f}, naive: {n['prefill_ratio']:.3f}"],
        ["harness overhead share (sampled)", f"{s['overhead_share']:.2%}", f"<= {GOALS['overhead_share']:.0%}",
         f"greedy ours {g['overhead_share']:.2%}, naive {n['overhead_share']:.2%}"],
        ["replicate groups with differing texts (sampled)", f"{result['replicates_differ']:.0%}", "", ""],
        [f"load {load['records']} records ({load['jsonl_mb']:.0f} MB) into the report's frame",
         f"{load['load_s']:.2f} s", f"< {GOALS['load_100k_s']:.0f} s", f"again: {load['reload_s']:.2f} s"],
        ["peak RSS", f"{result['peak_rss_mb']:.0f} MB", "", f"model load {result['model_load_s']:.1f} s"],
    ]
    if "threads" in result["backend"]:
        rows.append(["torch threads", peer.thread_counts(result["backend"]), "", result["backend"]["threads_from"]])
    rows.append(load_row(result))
    if "scale" in result:
        rows += scale.rows(result["scale"])
    return tabulate(rows, headers=["measure", "value", "goal", "note"], tablefmt="github")


def load_row(result: dict[str, Any]) -> list[Any]:
    before, after = result["load_before"], result["load_after"]
    return ["load average (1, 5, 15 min) before -> after", f"{before[0]:.2f} -> {after[0]:.2f}", "",
            f"{', '.join(f'{x:.2f}' for x in before)} -> {', '.join(f'{x:.2f}' for x in after)}; "
            f"{os.cpu_count()} CPUs: only ratios within one run mean anything on a shared machine"]


def _mismatches(naive: dict[str, Any], ours: dict[str, Any]) -> int:
    naive_text = {r["sample_id"]: r["text"] for r in naive["records"]}
    return sum(naive_text[r["sample_id"]] != r["text"] for r in ours["records"])


def _identical(result: dict[str, Any], kind: str, samples: int) -> str:
    return f"{kind} outputs identical: " + ("yes" if result[f"{kind}_identical"] else
                                          f"NO, {result[f'{kind}_mismatches']} of {samples} differ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both runs, e.g. model.generation.max_new_tokens=32")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the sampled run")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: results/bench/<UTC time>.json)")
    parser.add_argument("--peer", choices=["auto", "off", "only"], default="auto",
                        help="hf against vllm on the same grid: auto = where vllm is installed; only = nothing else")
    parser.add_argument("--scale", choices=["auto", "off", "only"], default="auto",
                        help="analysis.report and analysis.regress over 20,000 and 200,000 synthetic records: "
                             "auto = after the hf runs; only = on a scripted run of the grid, nothing else")
    parser.add_argument("--peer-repeats", type=int, default=1,
                        help="timed runs of each backend in the peer comparison, in turns; the median is reported")
    parser.add_argument("--peer-grids", type=_names(peer.GRIDS), default=[],
                        help=f"comma-separated named grids of the peer comparison ({', '.join(peer.GRIDS)}), each with "
                             "the overrides after it; default: the overrides alone")
    parser.add_argument("--peer-models", type=lambda text: text.split(","), default=[],
                        help="comma-separated model configs of the peer comparison, e.g. smollm2-135m,qwen2.5-coder-0.5b; "
                             "default: the config's")
    parser.add_argument("--peer-dtypes", type=_names(peer.DTYPES), default=["float32"],
                        help=f"comma-separated dtypes of the peer comparison ({', '.join(peer.DTYPES)}); default: float32")
    args = parser.parse_args(argv)
    if args.peer_repeats < 1:
        parser.error(f"--peer-repeats must be >= 1, got {args.peer_repeats}")
    cells = {"grids": args.peer_grids, "models": args.peer_models, "dtypes": args.peer_dtypes}

    load_before = os.getloadavg()
    if args.scale == "only":
        return write({**scale_result(args.overrides), "load_before": load_before, "load_after": os.getloadavg()},
                     args.out, "")
    if args.peer == "only":
        if not vllm_installed():
            print('statusbench: error: --peer only needs vllm (see the README: vLLM on a CPU machine)', file=sys.stderr)
            return 2
        return write({**peer_result(args.overrides, args.peer_repeats, **cells), "load_before": load_before,
                      "load_after": os.getloadavg()}, args.out, "")
    base = ["experiment.replicates=4", "run.progress=false", "run.report=false", *args.overrides]
    with user_errors():
        greedy_cfg = compose_config([*base, "model.generation.temperature=0"])
        sampled_cfg = compose_config([*base, f"model.generation.temperature={args.temperature}"])
    if greedy_cfg.backend.name != "hf":
        print("statusbench: error: the benchmark measures the hf backend (backend=hf)", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    backend = make_backend(greedy_cfg.model, greedy_cfg.backend)
    model_load = time.perf_counter() - t0
    with backend, tempfile.TemporaryDirectory(prefix="statusbench-bench-") as tmp:
        backend.generate([first_steps(greedy_cfg)[0].request])  # warm-up: first-call allocations are nobody's cost
        ours = timed_run(greedy_cfg, backend, Path(tmp) / "ours", share_prefix=True)
        naive = timed_run(greedy_cfg, backend, Path(tmp) / "naive", share_prefix=False, batch_size=1)
        sampled = timed_run(sampled_cfg, backend, Path(tmp) / "sampled", share_prefix=True)
        sampled_naive = timed_run(sampled_cfg, backend, Path(tmp) / "sampled_naive", share_prefix=False, batch_size=1)
        load = load_100k(sampled["records"], Path(tmp) / "synthetic")
        scaled = {} if args.scale == "off" else {
            "scale": scale.analysis_scale(sampled["records"], Path(tmp) / "sampled" / PROMPTS, Path(tmp) / "scale")}
    mismatches, sampled_mismatches = _mismatches(naive, ours), _mismatches(sampled_naive, sampled)
    result = {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv[1:],
        "overrides": args.overrides, "temperature_sampled": args.temperature, "model": greedy_cfg.model.name,
        "backend": backend.describe(), "batch_size": greedy_cfg.backend.batch_size, "run_batch_size": greedy_cfg.run.batch_size,
        "max_new_tokens": greedy_cfg.model.generation.max_new_tokens, "platform": platform.platform(),
        "model_load_s": model_load, "naive_over_ours": naive["wall_s"] / ours["wall_s"],
        "naive_over_ours_sampled": sampled_naive["wall_s"] / sampled["wall_s"],
        "greedy_identical": mismatches == 0, "greedy_mismatches": mismatches,
        "sampled_identical": sampled_mismatches == 0, "sampled_mismatches": sampled_mismatches,
        "replicates_differ": replicates_differ(sampled["records"]), "load": load, **scaled,
        # ru_maxrss is in KiB on Linux
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "goals": GOALS,
        **{name: {k: v for k, v in run.items() if k != "records"}
           for name, run in (("greedy_ours", ours), ("greedy_naive", naive), ("sampled_ours", sampled),
                             ("sampled_naive", sampled_naive))},
    }
    if args.peer == "auto":
        result["peer"] = peer_result(args.overrides, args.peer_repeats, **cells)["peer"] if vllm_installed() else {"skipped": "vllm is not installed"}
    result["load_before"], result["load_after"] = load_before, os.getloadavg()
    return write(result, args.out, table(result))


def _names(allowed: Any) -> Any:
    def parse(text: str) -> list[str]:
        names = text.split(",")
        if unknown := [n for n in names if n not in allowed]:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)} (known: {', '.join(allowed)})")
        return names
    return parse


def peer_result(overrides: list[str], repeats: int = 1, grids: Sequence[str] = (), models: Sequence[str] = (),
                dtypes: Sequence[str] = ("float32",)) -> dict[str, Any]:
    """The peer comparison's cells (`peer.matrix`): a list, one per grid x model x dtype."""
    with user_errors(), tempfile.TemporaryDirectory(prefix="statusbench-peer-") as tmp:
        cells = peer.matrix(overrides, Path(tmp), repeats, list(grids), list(models), list(dtypes))
    return {"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv[1:],
            "platform": platform.platform(), "peer": cells}


def scale_result(overrides: list[str], sizes: tuple[int, ...] = scale.SIZES) -> dict[str, Any]:
    """analysis_scale on the records of a scripted run of the grid (every sample answered "I will not
    call."), where no model runs."""
    with tempfile.TemporaryDirectory(prefix="statusbench-scale-") as tmp:
        answers = Path(tmp) / "answers.jsonl"
        answers.touch()  # the config checks the file exists; its lines follow from the plan
        with user_errors():
            cfg = compose_config(["run.progress=false", "run.report=false", *overrides, "backend=scripted",
                                  f"backend.path={answers}", "backend.match=order"])
        answers.write_text("".join(canonical_json({"text": "I will not call."}) + "\n" for _ in first_steps(cfg)))
        execute(cfg, {}, Path(tmp) / "run")
        records = read_jsonl(Path(tmp) / "run" / "records.jsonl")
        result = scale.analysis_scale(records, Path(tmp) / "run" / PROMPTS, Path(tmp) / "scale", sizes)
    return {"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv[1:],
            "platform": platform.platform(), "scale": result}


def write(result: dict[str, Any], out: Path | None, text: str) -> int:
    cells = result.get("peer")
    if isinstance(cells, list):  # one cell: its whole table; several: a row each
        text = (text + "\n\n" if text else "") + (peer.table(cells[0]) if len(cells) == 1 else peer.matrix_table(cells))
    if "greedy_ours" not in result:  # --scale only, --peer only: what the full table would have said
        from tabulate import tabulate

        extra = scale.rows(result["scale"]) if "scale" in result else []
        text = (text + "\n\n" if text else "") + tabulate([*extra, load_row(result)], headers=["measure", "value", "goal", "note"],
                                                         tablefmt="github")
    out = out or Path("results") / "bench" / f"{result['created_at'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(text)
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
