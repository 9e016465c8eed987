"""The openai backend beyond chat: the Responses API, the rendered-prompt completions endpoint, bytes that
are not UTF-8, and batch mode (lifecycles and a killed run resumed), against the loopback server of
tests/openai_server.py; and the identities that keep existing sample ids."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from harness import progress
from harness.backends.batch import BatchError, batch_key, stored_path
from harness.backends.openai_api import OpenAIBackend
from harness.backends.openai_wire import responses_input
from harness.run import first_steps
from harness.types import GenerationSettings
from tests.conftest import REPO, make_cfg, pin_test_model, run_cli
from tests.openai_server import OpenAIServer


def _backend(server: OpenAIServer, *overrides: str) -> tuple[OpenAIBackend, list]:
    cfg = make_cfg("backend=openai", "backend.api_key_env=null", f"backend.base_url={server.base_url}", *overrides)
    return OpenAIBackend(cfg.model, cfg.backend), [s.request for s in first_steps(cfg)]


# --- identities -----------------------------------------------------------------------------------

def test_new_settings_at_their_defaults_leave_sample_ids_and_backend_identity_as_they_were():
    gen = GenerationSettings()
    before = {"max_new_tokens": 256, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}  # the fields ids hashed so far
    assert gen.identity() == before and set(asdict(gen)) - set(before) == {"reasoning_effort", "thinking_budget"}
    assert set(make_cfg("backend=openai", "backend.api_key_env=null").backend.identity()) == {"name", "base_url", "served_model", "extra_body"}
    api = ["backend=openai", "backend.api_key_env=null"]
    base = [s.sample_id for s in first_steps(make_cfg(*api))]
    assert base == [s.sample_id for s in first_steps(make_cfg(*api, "model.generation.reasoning_effort=null"))]
    assert not set(base) & {s.sample_id for s in first_steps(make_cfg(*api, "model.generation.reasoning_effort=high"))}
    assert make_cfg("backend=openai", "backend.api_key_env=null", "backend.api=responses").backend.identity()["api"] == "responses"


# --- Responses API --------------------------------------------------------------------------------

def test_responses_input_keeps_calls_and_results_as_items():
    req = first_steps(make_cfg("scenario.calls_made=[3]", "condition=[none]"))[0].request
    items = responses_input(req.messages)
    calls = [i for i in items if i.get("type") == "function_call"]
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert calls and [c["call_id"] for c in calls] == [o["call_id"] for o in outputs]
    assert all(isinstance(c["arguments"], str) and json.loads(c["arguments"]) for c in calls)
    texts = [i["content"] for i in items if "role" in i]
    assert texts == [m["content"] for m in req.messages if m["role"] != "tool" and (m.get("content") or not m.get("tool_calls"))]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_effort_reasoning_tokens_cached_tokens_and_calls_over_the_wire(stream):
    with OpenAIServer() as server:
        backend, requests = _backend(server, "backend.api=responses", f"backend.stream={str(stream).lower()}",
                                     "model.generation.reasoning_effort=low")
        out = backend.generate(requests[:4])
    sent = [body for path, body in server.requests]
    assert all(b["reasoning"] == {"effort": "low", "summary": "auto"} and b["store"] is False for b in sent)
    assert all(b["tools"][0]["name"] == "phone_call" and "function" not in b["tools"][0] for b in sent)
    for c in out:
        assert c.error is None and c.reasoning == "Counted the calls so far."
        assert c.thinking_tokens == 8 and c.thinking_tokens_source == "api" and c.answer_tokens == c.completion_tokens - 8
        assert c.request_id and (c.ttft_s is not None) == stream
        assert c.finish_reason == ("tool_calls" if c.tool_calls else "stop")
        for call in c.tool_calls:
            assert call["function"]["name"] == "phone_call" and json.loads(call["function"]["arguments"])["company"] == "Xfinity"
        assert c.cache_write_tokens == c.prompt_tokens - c.cached_prompt_tokens
    assert sum(c.cached_prompt_tokens > 0 for c in out) >= 3  # the later requests share the earlier ones' first items


# --- the rendered prompt through /v1/completions ---------------------------------------------------

def test_completions_send_the_records_rendered_prompt_and_neutral_penalties_only_when_greedy():
    from transformers import AutoTokenizer

    from harness.models import sources
    from harness.render import PromptRenderer

    with OpenAIServer(model="any-name-it-likes") as server:
        backend, requests = _backend(server, "backend.api=completions")
        out = backend.generate(requests[:2])
        sampled, sampled_requests = _backend(server, "backend.api=completions", "model.generation.temperature=0.7")
        sampled.generate(sampled_requests[:1])
    cfg = make_cfg()
    path, _ = sources.resolve(cfg.model)
    render = PromptRenderer(AutoTokenizer.from_pretrained(path), cfg.model)
    greedy_bodies = [body for _, body in server.requests[:2]]
    for req, c in zip(requests, out):
        body = next(b for b in greedy_bodies if b["prompt"] == render(req.messages, req.tools))  # what hf renders, sent as is
        assert c.prompt_text == body["prompt"] and c.error is None
        assert {k: body[k] for k in ("frequency_penalty", "presence_penalty", "repeat_penalty", "repetition_penalty")} == \
            {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0}
        assert c.thinking_tokens == 0 and c.thinking_tokens_source == "estimated"
    assert not {"repeat_penalty", "frequency_penalty"} & set(server.requests[-1][1])  # sampling keeps the server's own
    assert backend.reported_models == {"any-name-it-likes": 2}  # a server that answers under any name: the name it gave


def test_a_server_that_refuses_unknown_fields_takes_fewer_penalties_and_an_unknown_one_is_refused():
    from harness.backends.openai_wire import completions_kwargs
    from harness.errors import ConfigError

    cfg = make_cfg("backend=openai", "backend.api_key_env=null", "backend.api=completions",
                   "backend.neutral_penalties=[frequency_penalty,presence_penalty]")  # transformers serve's set
    req = first_steps(cfg)[0].request
    kwargs = completions_kwargs("m", "PROMPT", req, {}, cfg.backend.neutral_penalties, stream=False)
    assert kwargs["extra_body"] == {"frequency_penalty": 0.0, "presence_penalty": 0.0}
    with pytest.raises(ConfigError, match="backend.neutral_penalties: unknown penalty 'repeat_last_n'"):
        make_cfg("backend=openai", "backend.api_key_env=null", "backend.neutral_penalties=[repeat_last_n]")


# --- bytes that are not UTF-8 (issue 41) ------------------------------------------------------------

def test_invalid_utf8_in_a_200_keeps_the_answer_with_replacement_characters():
    import httpx2

    body = (b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{"index": 0, '
            b'"finish_reason": "stop", "message": {"role": "assistant", "content": "No \xff\xfe more calls to Xfinity \xc3'
            b'\xa9t\xc3"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}')

    def chunks():  # "é" split across two chunks is one character, not two replacements
        i = body.index(b"\xc3\xa9") + 1
        yield body[:i]
        yield body[i:]

    class Split(httpx2.AsyncByteStream):
        async def __aiter__(self):
            for c in chunks():
                yield c

    def handler(request):
        return httpx2.Response(200, stream=Split(), headers={"content-type": "application/json"})

    cfg = make_cfg("backend=openai", "backend.api_key_env=null", "backend.base_url=http://stub.invalid/v1", "backend.max_retries=0")
    backend = OpenAIBackend(cfg.model, cfg.backend, transport_factory=lambda: httpx2.MockTransport(handler))
    [c] = backend.generate([first_steps(cfg)[0].request])
    assert c.error is None and c.text == "No \ufffd\ufffd more calls to Xfinity \u00e9t\ufffd"


# --- batch mode -------------------------------------------------------------------------------------

def _advances(fn):
    moves: list[float] = []
    with progress.reporting(moves.append, 10**6):
        result = fn()
    return result, moves


def test_batch_lifecycle_in_progress_then_completed_with_a_partial_failure(tmp_path):
    with OpenAIServer() as server:
        backend, requests = _backend(server, "backend.batch=true", "backend.poll_s=0.01")
        backend.attach(tmp_path)
        server.errored = {requests[1].sample_id}
        out, moves = _advances(lambda: backend.generate(requests[:4]))
        stored = json.loads(stored_path(tmp_path, batch_key([r.sample_id for r in requests[:4]])).read_text())
    assert server.batches_created == 1 and stored["batch_id"] == "batch_0001"
    assert sorted(stored["sample_ids"]) == sorted(r.sample_id for r in requests[:4])
    assert [c.error is None for c in out] == [True, False, True, True] and all(c.batched for c in out)
    assert out[1].error.startswith("openai batch: http 400") and "max_tokens is too large" in out[1].error
    assert out[0].request_id == f"req_{requests[0].sample_id}" and out[0].prompt_tokens
    assert sum(moves[:-1]) == 4  # the bar moved as the provider counted requests done, before the call returned
    batch_file = server.files["file-0001"].decode()
    assert [json.loads(line)["url"] for line in batch_file.splitlines()] == ["/v1/chat/completions"] * 4


@pytest.mark.parametrize("outcome", ["expired", "failed"])
def test_an_expired_or_failed_batch_answers_what_it_ran_and_errors_the_rest(tmp_path, outcome):
    with OpenAIServer(outcome=outcome) as server:
        backend, requests = _backend(server, "backend.batch=true", "backend.poll_s=0.01", "backend.api=responses")
        backend.attach(tmp_path)
        out = backend.generate(requests[:4])
    answered = [c for c in out if c.error is None]
    assert len(answered) == (2 if outcome == "expired" else 0)
    for c in out:
        if c.error:
            assert f"({outcome})" in c.error
    if outcome == "failed":
        assert all("This line is not parseable" in c.error for c in out)


def test_a_stored_batch_is_polled_again_and_a_lost_id_is_found_by_its_key(tmp_path):
    with OpenAIServer() as server:
        server.release.clear()
        backend, requests = _backend(server, "backend.batch=true", "backend.poll_s=0.01")
        path = stored_path(tmp_path, batch_key([r.sample_id for r in requests[:3]]))
        import asyncio

        from harness.backends import batch as batch_mod

        api = backend._batch()

        async def submit_only(submission):
            async with api.client() as client:
                return await api.submit(client, requests[:3], submission)

        asyncio.run(submit_only("another-run"))  # the same samples submitted by another run: never this run's batch
        asyncio.run(submit_only("0123abcd"))  # at the provider, its id never written: a kill between the answer and the write
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"provider": "openai", "started_at": "then", "submission": "0123abcd"}))
        server.release.set()
        backend.attach(tmp_path)
        out = backend.generate(requests[:3])
        assert server.batches_created == 2 and all(c.error is None for c in out)
        assert json.loads(path.read_text())["batch_id"] == "batch_0002"
        assert batch_mod.BATCHES_DIR in str(path)


def test_anthropic_batch_whose_id_was_lost_is_refused_in_one_line(tmp_path):
    pytest.importorskip("anthropic")
    from harness.backends.anthropic_api import AnthropicBackend
    from tests.anthropic_server import AnthropicServer

    with AnthropicServer() as server:
        cfg = make_cfg("backend=anthropic", "backend.api_key_env=null", f"backend.base_url={server.root}", "backend.batch=true")
        requests = [s.request for s in first_steps(cfg)[:2]]
        path = stored_path(tmp_path, batch_key([r.sample_id for r in requests]))
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"provider": "anthropic", "started_at": "2026-12-01T00:00:00+00:00"}))
        backend = AnthropicBackend(cfg.model, cfg.backend)
        backend.attach(tmp_path)
        with pytest.raises(BatchError, match=f"delete {path} to submit again"):
            backend.generate(requests)
    assert server.batches_created == 0


COMPARED = ("text", "tool_calls", "label", "reason", "prompt_tokens", "completion_tokens", "thinking_tokens",
            "thinking_tokens_source", "cost_usd", "batched", "error", "finish_reason")


def _records(root: Path) -> dict[str, dict]:
    [run_dir] = [p for p in (root / "status_ablation").iterdir() if p.is_dir()]
    rows = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    return {r["sample_id"]: {k: r[k] for k in COMPARED} for r in rows}


def test_a_batch_run_killed_after_submission_resumes_the_same_batch_and_matches_an_uninterrupted_run(tmp_path):
    """The issue's done-when: a batch run killed after submission and run again polls the same batch
    (submitted once) and ends with the records of an uninterrupted run."""
    with OpenAIServer() as server:
        args = ["backend=openai", "backend.api_key_env=null", f"backend.base_url={server.base_url}", "backend.batch=true",
                "backend.poll_s=0.1", "run.progress=false", "run.report=false", "model.price_input_per_mtok=2.0",
                "model.price_output_per_mtok=8.0", "+model.batch_discount=0.5"]
        server.release.clear()  # submitted, then in progress until released
        killed = subprocess.Popen([sys.executable, "-m", "harness.run", *pin_test_model([*args, f"run.root={tmp_path / 'a'}"])],
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 300
        stored = []
        while not stored and time.monotonic() < deadline and killed.poll() is None:
            stored = [p for p in (tmp_path / "a").rglob("batches/*.json") if "batch_id" in p.read_text()]
            time.sleep(0.2)
        assert stored, killed.communicate()[0][-3000:] if killed.poll() is not None else "no batch stored in time"
        killed.kill()
        killed.wait()
        assert server.batches_created == 1 and not list((tmp_path / "a").rglob("records.jsonl"))
        server.release.set()
        resumed = run_cli(*args, f"run.root={tmp_path / 'a'}")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert server.batches_created == 1, "the rerun submitted again instead of polling the stored batch"
        assert "resuming openai batch batch_0001" in resumed.stdout + resumed.stderr
        whole = run_cli(*args, f"run.root={tmp_path / 'b'}")
        assert whole.returncode == 0, whole.stderr[-3000:]
        assert server.batches_created == 2
    a, b = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert len(a) == 24 and a == b
    assert all(r["batched"] and r["cost_usd"] is not None for r in a.values())


def test_a_thinking_setting_no_backend_sends_is_refused_not_dropped():
    from harness.errors import ConfigError

    for backend in (["backend=hf"], ["backend=openai", "backend.api_key_env=null", "backend.api=completions"]):
        with pytest.raises(ConfigError, match="model.generation.reasoning_effort: backend .* sends no thinking setting"):
            make_cfg(*backend, "model.generation.reasoning_effort=low")


def test_batch_mode_is_refused_for_rollouts_and_with_streaming():
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="backend.batch: a rollout's step depends"):
        make_cfg("experiment=agent_loop", "backend=openai", "backend.api_key_env=null", "backend.batch=true")
    with pytest.raises(ConfigError, match="a batch API does not stream"):
        make_cfg("backend=openai", "backend.api_key_env=null", "backend.batch=true", "backend.stream=true")
