"""The embedded SmolLM2-135M on CPU: a tiny real run, and the decode loop against transformers."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.run import first_steps
from tests.conftest import make_cfg, run_cli

pytestmark = pytest.mark.model
TINY = ["scenario.calls_made=[2,3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
        "model.generation.max_new_tokens=8", "backend.threads=1"]  # two threads oversubscribe a shared CPU


@pytest.fixture(scope="module")
def backend():
    from harness.backends import make_backend

    cfg = make_cfg(*TINY)
    return make_backend(cfg.model, cfg.backend)


def test_tiny_grid_end_to_end(tmp_path: Path):
    args = [*TINY, f"run.root={tmp_path}", "run.name=tiny"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "status_ablation" / "tiny"
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and len({r["sample_id"] for r in records}) == 4
    assert {(r["condition"], r["params"]["calls_made"]) for r in records} == {
        (c, n) for c in ("none", "status_tail") for n in (2, 3)}
    prompts = {p["prompt_sha256"]: p for p in map(json.loads, (run_dir / "prompts.jsonl").read_text().splitlines())}
    for r in records:
        assert not r["scripted"] and r["error"] is None and r["backend"] == "hf"
        assert 1 <= r["completion_tokens"] <= 8 and r["thinking_tokens"] == 0 and r["thinking_tokens_source"] == "counted"
        assert r["answer_tokens"] == r["completion_tokens"] and r["prompt_tokens"] > 300 and r["latency_s"] > 0
        assert r["label"] in ("violated", "complied", "refused", "other", "truncated")
        assert r["label"] != "truncated" or r["finish_reason"] == "length"  # only a cut completion is truncated
        assert r["correct"] == (r["label"] == r["expected"])
        rendered = prompts[r["prompt_sha256"]]["rendered"]
        # every call record and search result reached the model
        assert rendered.count("<tool_response>") == r["params"]["calls_made"] + 2
        assert ("<agent_status>" in rendered) == (r["condition"] == "status_tail")
        assert rendered.endswith("<|im_start|>assistant\n")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["model"]["revision"].startswith("gguf-sha256:") and manifest["finished_at"]
    assert "torch" in manifest["packages"]

    second = run_cli(*args)
    assert second.returncode == 0, second.stderr
    assert "4 already done, 0 new" in second.stdout and "generate" not in second.stderr  # no progress bar: no model call
    assert len((run_dir / "records.jsonl").read_text().splitlines()) == 4


OPTS = {"batch_size": 8, "share_prefix": True}


def test_batched_greedy_matches_transformers_generate(backend):
    import torch

    requests = [s.request for s in first_steps(make_cfg(*TINY))]
    prompts = [backend.tokenizer(backend.render(r), add_special_tokens=False)["input_ids"] for r in requests[:3]]
    prompts[1] = prompts[1][:200]  # different lengths exercise left padding
    ours = backend.decoder.decode(prompts, requests[0].generation, [0, 0, 0], **OPTS)
    for p, tokens in zip(prompts, (d.tokens for d in ours)):
        with torch.inference_mode():
            ref = backend.model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                         max_new_tokens=8, do_sample=False, pad_token_id=min(backend.eos_ids))
        assert tokens == ref[0, len(p):].tolist()  # the whole continuation: same tokens, same stopping point


def test_sampling_depends_on_the_seed_not_the_batch(backend):
    requests = [s.request for s in first_steps(make_cfg(*TINY))]
    gen = replace(requests[0].generation, temperature=1.0, top_p=0.95, top_k=50)
    prompts = [backend.tokenizer(backend.render(r), add_special_tokens=False)["input_ids"] for r in requests[:2]]
    together = backend.decoder.decode(prompts, gen, [11, 12], **OPTS)
    alone = backend.decoder.decode(prompts[:1], gen, [11], **OPTS)
    assert together[0].tokens == alone[0].tokens
    assert backend.decoder.decode(prompts[:1], gen, [11], **OPTS)[0].tokens == alone[0].tokens
    # the seed is what makes a sample: other seeds draw other continuations from the same prompt
    others = {tuple(d.tokens) for d in backend.decoder.decode(prompts[:1] * 4, gen, [21, 22, 23, 24], **OPTS)}
    assert len(others | {tuple(alone[0].tokens)}) > 1


def test_a_prompt_over_the_context_is_an_error_record_for_that_sample(backend):
    req = first_steps(make_cfg(*TINY))[0].request
    messages = [*req.messages[:-1], {"role": "user", "content": "status? " * 9000}]  # ~18k tokens > SmolLM2's 8192
    long, short = backend.generate([replace(req, messages=messages), req])
    assert long.error.startswith("prompt too long:") and f"context is {backend.context}" in long.error
    assert long.prompt_tokens >= backend.context and long.completion_tokens is None
    assert short.error is None and short.completion_tokens >= 1


def test_a_thread_count_the_user_set_stays_and_an_automatic_one_follows_the_machine(backend, monkeypatch):
    from harness.backends import make_backend
    from harness.engine.threads import Adaptive

    assert backend.decoder.pace is None  # backend.threads=1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = make_cfg(*TINY[:-1])
    auto = make_backend(cfg.model, cfg.backend)
    assert isinstance(auto.decoder.pace, Adaptive) and auto.describe()["threads_from"].endswith("re-chosen while it runs")
    assert backend.describe()["threads_used"] == [1] and auto.describe()["threads_used"] == [auto.threads]
