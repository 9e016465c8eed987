"""`python -m harness.tools.export RUN_DIR --format inspect`: the real inspect_ai reads the log back
(samples, messages, usage with cache and reasoning tokens, scores = the records' labels), for the
default experiment (scripted completions), an API run with a prompt cache, and a rollout run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="the export is checked with the real inspect-ai (pip install -e '.[dev]')")

from inspect_ai.log import read_eval_log  # noqa: E402

from harness.run import first_steps  # noqa: E402
from tests.conftest import REPO, make_cfg, run_cli  # noqa: E402


def _run_dir(root: Path, experiment: str) -> Path:
    [run_dir] = [p for p in (root / experiment).iterdir() if p.is_dir()]
    return run_dir


def _export(run_dir: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "harness.tools.export", str(run_dir), "--format", "inspect"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [log] = (run_dir / "inspect").glob("*.eval")
    return log


def _records(run_dir: Path) -> dict[str, dict]:
    return {r["sample_id"]: r for r in map(json.loads, (run_dir / "records.jsonl").read_text().splitlines())}


def test_the_default_experiment_exported_reads_back_with_labels_messages_and_usage(tmp_path):
    """The issue's done-when: read_eval_log reads an exported run of the default experiment (here its
    completions scripted: a refusal, or a call in the Hermes format a small model writes, with usage)."""
    lines = []
    for i, s in enumerate(first_steps(make_cfg())):
        call = {"name": "phone_call", "arguments": {"company": "Xfinity", "reason": "chase the ticket"}}
        text = "I cannot call Xfinity again: the limit is reached." if i % 2 else f"<tool_call>{json.dumps(call)}</tool_call>"
        lines.append({"episode_id": s.request.episode_id, "condition": s.condition, "text": text,
                      "reasoning": "Count the calls first." if i % 3 == 0 else "",
                      "usage": {"prompt_tokens": 900 + i, "completion_tokens": 40, "thinking_tokens": 12 if i % 3 == 0 else 0}})
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = run_cli("backend=scripted", f"backend.path={path}", f"run.root={tmp_path}", "run.progress=false", "run.report=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _run_dir(tmp_path, "status_ablation")
    log = read_eval_log(str(_export(run_dir)))
    records = _records(run_dir)
    assert log.status == "success" and log.eval.model == "scripted/smollm2-135m" and len(log.samples) == len(records) == 24
    prompts = {r["prompt_sha256"]: r for r in map(json.loads, (run_dir / "prompts.jsonl").read_text().splitlines())}
    for sample in log.samples:
        r = records[sample.id]
        assert sample.scores["label"].value == r["label"] and sample.scores["correct"].value == ("C" if r["correct"] else "I")
        assert sample.target == r["expected"] and sample.metadata["condition"] == r["condition"]
        assert [m.role for m in sample.input] == [m["role"] for m in prompts[r["prompt_sha256"]]["messages"]]
        assert sample.messages[-1].role == "assistant" and sample.messages[-1].text == r["text"]
        assert bool(sample.messages[-1].tool_calls) == bool(r["tool_calls"])
        u = sample.model_usage["scripted/smollm2-135m"]
        assert (u.input_tokens, u.output_tokens, u.reasoning_tokens) == (r["prompt_tokens"], 40, r["thinking_tokens"])
        assert sample.metadata["thinking_tokens_source"] == "api"  # a scripted line's usage, as a server's
    accuracy = log.results.scores[0].metrics["accuracy"].value
    assert accuracy == pytest.approx(sum(r["correct"] for r in records.values()) / 24)
    assert log.stats.model_usage["scripted/smollm2-135m"].output_tokens == 40 * 24


def test_an_api_run_exports_cache_write_and_read_tokens(tmp_path):
    pytest.importorskip("anthropic")
    from tests.anthropic_server import AnthropicServer

    with AnthropicServer() as server:
        proc = run_cli("backend=anthropic", "backend.api_key_env=null", f"backend.base_url={server.root}", f"run.root={tmp_path}",
                       "run.progress=false", "run.report=false", "scenario.calls_made=[3]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _run_dir(tmp_path, "status_ablation")
    log = read_eval_log(str(_export(run_dir)))
    records = _records(run_dir)
    for sample in log.samples:
        r, u = records[sample.id], sample.model_usage["anthropic/smollm2-135m"]
        assert u.input_tokens_cache_read == r["cached_prompt_tokens"] and u.input_tokens_cache_write == r["cache_write_tokens"]
        assert u.input_tokens == r["prompt_tokens"] - r["cached_prompt_tokens"] - r["cache_write_tokens"]
        assert u.total_tokens == r["prompt_tokens"] + r["completion_tokens"] and sample.output.response_id == r["request_id"]
    assert sum(s.model_usage["anthropic/smollm2-135m"].input_tokens_cache_read for s in log.samples) > 0


def test_a_rollout_run_exports_one_sample_per_rollout_with_a_model_event_per_step(tmp_path):
    pytest.importorskip("anthropic")
    from tests.anthropic_server import AnthropicServer

    with AnthropicServer() as server:
        proc = run_cli("experiment=agent_loop", "backend=anthropic", "backend.api_key_env=null", f"backend.base_url={server.root}",
                       "scenario.episodes_per_cell=1", f"run.root={tmp_path}", "run.progress=false", "run.report=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _run_dir(tmp_path, "agent_loop")
    log = read_eval_log(str(_export(run_dir)))
    steps = list(_records(run_dir).values())
    rollouts = {r["rollout_id"]: r for r in map(json.loads, (run_dir / "rollouts.jsonl").read_text().splitlines())}
    assert len(log.samples) == len(rollouts) == 2
    for sample in log.samples:
        mine = sorted((s for s in steps if s["rollout_id"] == sample.id), key=lambda s: s["step"])
        events = [e for e in sample.events if e.event == "model"]
        assert len(events) == len(mine) == rollouts[sample.id]["steps"]
        assert [e.output.usage.input_tokens_cache_read for e in events] == [s["cached_prompt_tokens"] for s in mine]
        assert sample.scores["violations"].value == rollouts[sample.id]["violations"]
        assert sample.scores["outcome"].value == rollouts[sample.id]["outcome"]


def test_an_empty_or_missing_run_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness.tools.export", str(tmp_path), "--format", "inspect"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "holds no records" in proc.stderr
