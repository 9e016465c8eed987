"""The OpenAI-compatible backend: request shaping and error paths against a scripted transport, and a
small grid through a real `transformers serve` running the embedded SmolLM2."""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

from harness.backends.openai_api import OpenAIBackend
from harness.backends.openai_wire import request_kwargs, to_completion
from harness.types import GenerationSettings, Request
from tests.conftest import free_port, local_server, make_cfg, run_cli

SECRET = "sk-statusbench-test-0123456789abcdef"


def _request(**gen) -> Request:
    return Request(sample_id="s", episode_id="e", condition="none", replicate=0, index=0,
                   messages=[{"role": "user", "content": "hi"}], tools=[], seed=7,
                   generation=GenerationSettings(max_new_tokens=5, **gen))


def test_request_kwargs_send_extended_sampling_only_when_set():
    greedy = request_kwargs("m", _request(), {}, {}, stream=False)
    assert greedy == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                      "temperature": 0.0, "seed": 7}
    sampled = request_kwargs("m", _request(temperature=0.6, top_p=0.95, top_k=20), {"enable_thinking": True}, {},
                             stream=True)
    assert sampled["top_p"] == 0.95
    assert sampled["extra_body"] == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": True}}
    assert sampled["stream_options"] == {"include_usage": True}


def test_hermes_tool_format_sends_tool_traffic_as_text():
    from harness.run import first_steps

    req = first_steps(make_cfg("scenario.calls_made=[3]", "scenario.distractor_turns=[0]", "scenario.placement=[late]",
                             "scenario.episodes_per_cell=1", "condition=[none]"))[0].request
    native = request_kwargs("m", req, {}, {}, stream=False)
    assert native["tools"] == req.tools and any(m["role"] == "tool" for m in native["messages"])
    hermes = request_kwargs("m", req, {}, {}, stream=False, hermes=True)
    assert "tools" not in hermes and {m["role"] for m in hermes["messages"]} <= {"system", "user", "assistant"}
    assert "<tool_call>" in "".join(m["content"] for m in hermes["messages"])


def test_to_completion_reads_usage_and_splits_inline_thinking():
    usage = SimpleNamespace(prompt_tokens=100, completion_tokens=30, prompt_tokens_details=SimpleNamespace(cached_tokens=64),
                            completion_tokens_details=SimpleNamespace(reasoning_tokens=20))
    c = to_completion("<think>count calls</think>No more calls.", "", [], usage, "stop", 1.0, None)
    assert (c.reasoning, c.prompt_tokens, c.cached_prompt_tokens, c.thinking_tokens, c.answer_tokens) == \
        ("count calls", 100, 64, 20, 10)
    plain = to_completion("Hello", "", [], SimpleNamespace(prompt_tokens=5, completion_tokens=3), "stop", 1.0, None)
    assert (plain.thinking_tokens, plain.answer_tokens, plain.cached_prompt_tokens) == (0, 3, None)


def _scripted_backend(responses: list[tuple[int, dict]], seen: list[dict], **cfg_overrides):
    import httpx2

    answers = iter(responses)

    def handler(request):
        seen.append(json.loads(request.content))
        status, body = next(answers)
        return httpx2.Response(status, json=body, headers={"retry-after-ms": "1"})

    cfg = make_cfg("backend=openai", "backend.api_key_env=null", "backend.base_url=http://stub.invalid/v1",
                   *[f"backend.{k}={v}" for k, v in cfg_overrides.items()])
    return OpenAIBackend(cfg.model, cfg.backend, transport_factory=lambda: httpx2.MockTransport(handler))


OK_BODY = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
           "choices": [{"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "done", "reasoning_content": "I thought"}}],
           "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16,
                     "prompt_tokens_details": {"cached_tokens": 8}}}


def test_rate_limit_is_retried_then_succeeds():
    seen: list[dict] = []
    backend = _scripted_backend([(429, {"error": {"message": "slow down"}}), (200, OK_BODY)], seen)
    [c] = backend.generate([_request()])
    assert len(seen) == 2 and c.error is None
    assert (c.text, c.reasoning, c.prompt_tokens, c.cached_prompt_tokens) == ("done", "I thought", 12, 8)


def test_bad_request_is_an_immediate_error_with_the_servers_message():
    seen: list[dict] = []
    msg = "System message must be at the beginning."
    backend = _scripted_backend([(400, {"error": {"message": msg}})], seen)
    [c] = backend.generate([_request()])
    assert len(seen) == 1 and "http 400" in c.error and msg in c.error


def test_server_errors_exhaust_retries_then_error_record():
    seen: list[dict] = []
    backend = _scripted_backend([(503, {"error": {"message": "overloaded"}})] * 3, seen, max_retries=2)
    [c] = backend.generate([_request()])
    assert len(seen) == 3 and c.error.startswith("openai: http 503") and "overloaded" in c.error


# --- a real server --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served_smollm2(tmp_path_factory):
    pytest.importorskip("fastapi", reason="transformers serve needs transformers[serving] (pip install -e '.[dev]')")
    from harness.models import sources

    path, _ = sources.resolve(make_cfg().model)
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve",
               path, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    with local_server(command, log, "transformers serve", 120, port, env={**os.environ, "HF_HUB_OFFLINE": "1"}) as base:
        yield {"base_url": base + "/v1", "model_path": path}


GRID = ["scenario.calls_made=[3]", "scenario.distractor_turns=[0]", "scenario.placement=[late]",
        "scenario.episodes_per_cell=1", "model.generation.max_new_tokens=4", "run.report=false", "run.progress=false"]


@pytest.mark.model
@pytest.mark.parametrize("stream", [False, True])
def test_grid_through_transformers_serve(served_smollm2, tmp_path, stream, monkeypatch):
    monkeypatch.setenv("STATUSBENCH_TEST_KEY", SECRET)
    prices = ["model.price_input_per_mtok=2.0", "model.price_cached_input_per_mtok=0.5", "model.price_output_per_mtok=8.0"]
    proc = run_cli("backend=openai", f"backend.base_url={served_smollm2['base_url']}",
                   f"backend.served_model={served_smollm2['model_path']}", "backend.api_key_env=STATUSBENCH_TEST_KEY",
                   f"backend.stream={str(stream).lower()}", "backend.concurrency=2", f"run.root={tmp_path}", *GRID, *prices)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = [p for p in (tmp_path / "status_ablation").iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert sorted(r["condition"] for r in records) == ["none", "status_tail"]
    for r in records:
        assert r["backend"] == "openai" and r["error"] is None and not r["scripted"]
        assert r["prompt_tokens"] > 100 and 1 <= r["completion_tokens"] <= 4
        assert r["text"] and r["label"] != "error"
        assert r["cost_usd"] == pytest.approx(
            ((r["prompt_tokens"] - (r["cached_prompt_tokens"] or 0)) * 2.0 + (r["cached_prompt_tokens"] or 0) * 0.5
             + r["completion_tokens"] * 8.0) / 1e6)
        assert (r["ttft_s"] is not None) == stream
    # the tail status adds tokens on top of the identical trajectory
    by = {r["condition"]: r for r in records}
    assert by["status_tail"]["prompt_tokens"] > by["none"]["prompt_tokens"]
    # the key is nowhere on disk or in the output, only its variable's name
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in proc.stdout + proc.stderr
    assert "STATUSBENCH_TEST_KEY" in (run_dir / ".hydra" / "config.yaml").read_text()


@pytest.mark.model
@pytest.mark.parametrize("api", ["completions", "responses"])
def test_rendered_prompt_and_responses_api_through_transformers_serve(served_smollm2, tmp_path, api):
    """The two other endpoints against a real server: /v1/completions gets the very prompt the hf
    backend renders (transformers serve refuses unknown fields, so only OpenAI's two penalties go)."""
    from transformers import AutoTokenizer

    from harness.run import first_steps
    from harness.render import PromptRenderer

    proc = run_cli("backend=openai", f"backend.api={api}", f"backend.base_url={served_smollm2['base_url']}",
                   f"backend.served_model={served_smollm2['model_path']}", "backend.api_key_env=null",
                   "backend.neutral_penalties=[frequency_penalty,presence_penalty]", f"run.root={tmp_path}", *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = [p for p in (tmp_path / "status_ablation").iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    prompts = {p["prompt_sha256"]: p for p in map(json.loads, (run_dir / "prompts.jsonl").read_text().splitlines())}
    render = PromptRenderer(AutoTokenizer.from_pretrained(served_smollm2["model_path"]), make_cfg().model)
    requests = {(s.request.episode_id, s.condition): s.request for s in first_steps(make_cfg(*GRID))}
    for r in records:
        assert r["error"] is None and r["text"] and 1 <= r["completion_tokens"] <= 4
        req = requests[r["episode_id"], r["condition"]]
        if api == "completions":  # the hf backend's prompt, sent as the server's prompt
            assert prompts[r["prompt_sha256"]]["rendered"] == render(req.messages, req.tools)
            assert r["thinking_tokens_source"] == "estimated"
        else:
            assert r["thinking_tokens_source"] == "api"


def _sse_backend(chunks: list[dict]):
    import httpx2

    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()

    def handler(request):
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    cfg = make_cfg("backend=openai", "backend.api_key_env=null", "backend.base_url=http://stub.invalid/v1",
                   "backend.stream=true", "backend.max_retries=0")
    return OpenAIBackend(cfg.model, cfg.backend, transport_factory=lambda: httpx2.MockTransport(handler))


def _chunk(content: str, finish: str | None) -> dict:
    return {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


def test_a_cut_stream_is_an_error_record_and_a_length_stop_is_truncated():
    from harness.run import first_steps
    from harness.measure.grading import grade

    episode = next(s.episode for s in first_steps(make_cfg()) if s.episode.expected == "refused")
    [cut] = _sse_backend([_chunk("I cannot ", None)]).generate([_request()])  # connection closed mid-answer
    assert cut.error and "without a finish reason" in cut.error and cut.text == "I cannot "
    assert grade(episode, cut)[:2] == ("error", False)
    [full] = _sse_backend([_chunk("I cannot call them again.", None), _chunk("", "stop")]).generate([_request()])
    assert full.error is None and grade(episode, full)[:2] == ("refused", True)
    [long] = _sse_backend([_chunk("I'm sorry for any misunderstanding. I'm sorry", None), _chunk("", "length")]).generate([_request()])
    assert long.finish_reason == "length" and grade(episode, long)[:2] == ("truncated", False)


def test_latency_is_each_requests_own_and_the_batchs_is_kept_apart():
    backend = _scripted_backend([(429, {"error": {"message": "slow down"}}), (200, OK_BODY), (200, OK_BODY)], [])
    first, second = backend.generate([_request(), _request()])
    for c in (first, second):
        assert c.error is None and 0 < c.latency_s <= c.batch_latency_s
    assert first.batch_latency_s == second.batch_latency_s
