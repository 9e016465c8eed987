"""A Hydra multirun through the submitit launcher's local executor: two jobs (two models), each in its
own process, with scripted completions so no model loads; both jobs' records are checked."""
from __future__ import annotations

import json

import pytest

from tests.conftest import make_cfg, run_cli

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs hydra-submitit-launcher (pip install -e .)")

GRID = ["scenario.calls_made=[2,3]", "scenario.distractor_turns=[0]", "scenario.placement=[late]",
        "scenario.episodes_per_cell=1", "condition=[none,status_tail]"]
CALL = '<tool_call>{"name": "phone_call", "arguments": {"company": "Xfinity", "reason": "chase the ticket"}}</tool_call>'


def test_two_job_multirun_with_the_submitit_local_launcher(tmp_path):
    completions = tmp_path / "completions.jsonl"
    completions.write_text("\n".join(json.dumps({"text": CALL}) for _ in range(4)) + "\n")
    proc = run_cli("-m", "hydra/launcher=local_parallel", "model=smollm2-135m,qwen3-0.6b", "backend=scripted",
                   f"backend.path={completions}", "backend.match=order", *GRID, f"run.root={tmp_path / 'results'}",
                   "run.progress=false", "run.report=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "results" / "status_ablation"
    assert any((sweep / ".submitit").iterdir())  # the jobs went through submitit, not the basic launcher
    for model in ("smollm2-135m", "qwen3-0.6b"):
        rows = [json.loads(line) for line in (sweep / f"{model}-scripted-xfinity" / "records.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and {r["model"] for r in rows} == {model}
        assert all(r["scripted"] and r["error"] is None and r["cost_usd"] is None for r in rows)
        # the same call graded against each episode's rule: allowed below the limit, a violation at it
        assert {(r["params"]["calls_made"], r["label"]) for r in rows} == {(2, "complied"), (3, "violated")}


def test_paper_sweep_preset_composes():
    cfg = make_cfg("experiment=paper_sweep", "model=qwen3-8b")
    assert cfg.backend.name == "vllm" and cfg.experiment.name == "paper_sweep"
    assert {"none", "status_tail"} <= set(cfg.conditions)
    assert len(cfg.scenario.calls_made) > 1 and len(cfg.scenario.distractor_turns) > 1
