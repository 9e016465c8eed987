"""backend=anthropic: the conversion of our chat messages to the Messages API on every family's episodes,
cache breakpoints, thinking settings, and the official SDK against a loopback server that speaks the
wire format (tests/anthropic_server.py): usage, streaming, retries, redaction, a rollout's cache per
step, batches."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("anthropic", reason='backend=anthropic needs the anthropic SDK (pip install -e ".[anthropic]")')

from harness.backends.anthropic_api import AnthropicBackend, CacheAt, mark_cache, request_kwargs, to_messages, to_tools  # noqa: E402
from harness.context.calls import call_arguments  # noqa: E402
from harness.errors import ConfigError  # noqa: E402
from harness.run import first_steps  # noqa: E402
from tests.anthropic_server import AnthropicServer  # noqa: E402
from harness.config.compose import CONF_DIR  # noqa: E402
from tests.conftest import make_cfg, run_cli  # noqa: E402
from tests.loopback import tokens  # noqa: E402

SECRET = "sk-ant-statusbench-test-0123456789abcdef"
FAMILIES = sorted(p.stem for p in (CONF_DIR / "scenario").glob("*.yaml"))


def _plan(*overrides: str):
    return first_steps(make_cfg("backend=anthropic", "backend.api_key_env=null", *overrides))


def _family_plan(family: str):
    """Every condition that places text where the conversion must keep it: none, the tail bar, the
    appended bars, a system message mid-conversation."""
    for conditions in ("[none,status_tail,status_append,status_mid]", "[none,status_tail]"):
        try:
            return _plan(f"scenario={family}", f"condition={conditions}")
        except ConfigError:
            continue
    raise AssertionError(f"no plan for {family}")


def _check_conversion(messages: list[dict], tools: list[dict]) -> None:
    system, out = to_messages(messages)
    leading = 0
    while leading < len(messages) and messages[leading]["role"] == "system":
        leading += 1
    assert [b["text"] for b in system] == [m["content"] for m in messages[:leading] if m["content"]]
    for prev, m in zip(out, out[1:]):
        assert prev["role"] != m["role"], "consecutive messages of one role must merge"
    for i, m in enumerate(out):
        assert m["role"] in ("user", "assistant", "system") and m["content"]
        assert all(b["text"] for b in m["content"] if b["type"] == "text"), "the API refuses an empty text block"
        if m["role"] == "system":
            assert i > 0 and out[i - 1]["role"] == "user", "a mid-conversation system message follows a user turn"
        uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        if uses:  # every call answered, first thing, in the next message
            nxt = out[i + 1]["content"] if i + 1 < len(out) else []
            results = [b["tool_use_id"] for b in nxt if b["type"] == "tool_result"]
            if nxt:
                assert results == uses and all(b["type"] == "tool_result" for b in nxt[:len(results)])
        for b in m["content"]:
            if b["type"] == "tool_result":
                assert i > 0 and b["tool_use_id"] in [x.get("id") for x in out[i - 1]["content"] if x["type"] == "tool_use"]
    # nothing lost: every text, result and call of the conversation, in order
    expected = []
    for m in messages[leading:]:
        if m["role"] == "tool":
            expected.append(("tool_result", m["content"]))
            continue
        if m.get("content"):
            expected.append(("text", m["content"]))
        expected += [("tool_use", (c["function"]["name"], call_arguments(c))) for c in m.get("tool_calls") or []]
    got = [("text", b["text"]) if b["type"] == "text" else ("tool_result", b["content"]) if b["type"] == "tool_result"
           else ("tool_use", (b["name"], b["input"])) for m in out for b in m["content"]]
    assert got == expected
    assert [t["name"] for t in to_tools(tools)] == [t["function"]["name"] for t in tools]


@pytest.mark.parametrize("family", FAMILIES)
def test_conversion_keeps_every_familys_episodes(family):
    plan = _family_plan(family)
    assert plan
    for sample in plan:
        _check_conversion(sample.request.messages, sample.request.tools)


def test_cache_breakpoints_end_before_tail_and_none():
    req = next(s.request for s in _plan("condition=[status_tail]", "scenario.calls_made=[3]"))
    system, messages = to_messages(req.messages)
    tools = to_tools(req.tools)
    mark_cache(system, tools, messages, CacheAt.end)
    assert system[-1]["cache_control"] == {"type": "ephemeral"} and "cache_control" not in tools[-1]
    assert messages[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "<agent_status>" in messages[-1]["content"][-1]["text"]  # the bar is the last block
    marked = [b for m in messages for b in m["content"] if "cache_control" in b]
    assert len(marked) == 1
    system, messages = to_messages(req.messages)
    mark_cache(system, tools, messages, CacheAt.before_tail)
    [marked] = [b for m in messages for b in m["content"] if "cache_control" in b]
    assert marked["type"] == "tool_result" or "<agent_status>" not in marked.get("text", "")
    assert "cache_control" not in messages[-1]["content"][-1]
    system, messages = to_messages(req.messages)
    mark_cache(system, to_tools(req.tools), messages, CacheAt.none)
    assert "cache_control" not in json.dumps([system, messages])


def test_thinking_by_effort_or_budget_as_the_preset_says():
    effort = _plan("model=claude-sonnet-5.5", "model.generation.reasoning_effort=low")[0]
    cfg = make_cfg("backend=anthropic", "backend.api_key_env=null", "model=claude-sonnet-5.5", "model.generation.reasoning_effort=low")
    kw = request_kwargs("m", cfg.model, effort.request, cfg.backend)
    assert kw["thinking"] == {"type": "adaptive", "display": "summarized"} and kw["output_config"] == {"effort": "low"}
    assert "temperature" not in json.dumps(kw)  # the model takes no sampling settings
    with pytest.raises(ConfigError, match="thinking budget .* samples at temperature 1.0"):
        make_cfg("backend=anthropic", "model=claude-haiku-4.5", "model.generation.thinking_budget=1024")
    cfg = make_cfg("backend=anthropic", "backend.api_key_env=null", "model=claude-haiku-4.5", "model.generation.thinking_budget=1024",
                   "model.generation.temperature=1.0")
    kw = request_kwargs("m", cfg.model, first_steps(cfg)[0].request, cfg.backend)
    assert kw["thinking"] == {"type": "enabled", "budget_tokens": 1024, "display": "summarized"}
    assert kw["extra_body"]["temperature"] == 1.0
    with pytest.raises(ConfigError, match="reasoning_effort.*not an effort level"):
        make_cfg("backend=anthropic", "model=claude-haiku-4.5", "model.generation.reasoning_effort=low")
    with pytest.raises(ConfigError, match="takes no sampling settings"):
        make_cfg("backend=anthropic", "model=claude-sonnet-5.5", "model.generation.temperature=0")


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    """The key the backend reads, which a misconfigured server may echo (it must never be stored)."""
    monkeypatch.setenv("STATUSBENCH_TEST_KEY", SECRET)


def _backend(server: AnthropicServer, *overrides: str) -> tuple[AnthropicBackend, list]:
    cfg = make_cfg("backend=anthropic", "backend.api_key_env=STATUSBENCH_TEST_KEY", f"backend.base_url={server.root}",
                   "backend.max_retries=3", *overrides)
    return AnthropicBackend(cfg.model, cfg.backend), [s.request for s in first_steps(cfg)[:3]]


@pytest.mark.parametrize("stream", [False, True])
def test_usage_request_id_and_stop_reason_from_the_wire(stream):
    with AnthropicServer() as server:
        backend, requests = _backend(server, f"backend.stream={str(stream).lower()}")
        out = backend.generate(requests)
    for c in out:
        assert c.error is None and c.request_id and c.request_id.startswith("req_loop_")
        usage = server.answered[c.request_id]["usage"]  # what the server sent for this request
        assert (c.cached_prompt_tokens, c.cache_write_tokens, c.completion_tokens) == (
            usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"], usage["output_tokens"])
        assert c.prompt_tokens == usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
        assert c.thinking_tokens == 0 and c.thinking_tokens_source == "api"
        assert c.finish_reason in ("stop", "tool_calls") and (c.ttft_s is not None) == stream
        assert (c.finish_reason == "tool_calls") == bool(c.tool_calls)
    # the requests share the system prompt: the later ones read it from the cache
    assert sum(c.cached_prompt_tokens > 0 for c in out) >= 2


def test_thinking_kept_with_the_apis_count_or_unknown_without_it():
    with AnthropicServer() as server:
        backend, requests = _backend(server, "model=claude-sonnet-5.5", "model.generation.reasoning_effort=high")
        [c] = backend.generate(requests[:1])
    assert c.reasoning.startswith("The user asks again") and "(high effort)" in c.reasoning
    assert c.thinking_tokens > 32 and c.thinking_tokens_source == "api" and c.answer_tokens == c.completion_tokens - c.thinking_tokens
    with AnthropicServer(thinking_details=False) as server:  # an older model: no thinking count in the usage
        backend, requests = _backend(server, "model=claude-sonnet-5.5", "model.generation.reasoning_effort=high")
        [c] = backend.generate(requests[:1])
    assert c.reasoning and c.thinking_tokens is None and c.thinking_tokens_source is None and c.answer_tokens is None


def test_overloaded_and_rate_limited_are_retried_and_a_400_echoing_the_key_is_redacted():
    with AnthropicServer() as server:
        server.script = ["429", "529"]
        backend, requests = _backend(server)
        [ok] = backend.generate(requests[:1])
        assert ok.error is None and server.served == 3
        server.script = ["400echo"]
        [bad] = backend.generate(requests[:1])
        assert server.served == 4  # a 400 is not retried
        server.script = ["529"] * 4
        [overloaded] = backend.generate(requests[:1])
    assert bad.error.startswith("anthropic: http 400") and "invalid_request_error" in bad.error
    assert SECRET not in bad.error and SECRET[:12] not in bad.error and "[redacted]" in bad.error
    assert overloaded.error.startswith("anthropic: http 529") and "overloaded_error" in overloaded.error


def test_a_rollout_records_cache_write_and_read_per_step_and_append_reads_where_replace_misses(tmp_path):
    """The issue's done-when: per step of a rollout the records hold cache-write and cache-read tokens,
    and the report's cache table shows the append strategy reading the cache where replace misses."""
    with AnthropicServer() as server:
        proc = run_cli("experiment=agent_loop", "backend=anthropic", "backend.api_key_env=null", f"backend.base_url={server.root}",
                       "condition=[status_tail,status_append]", "scenario.episodes_per_cell=2", f"run.root={tmp_path}",
                       "run.progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = [p for p in (tmp_path / "agent_loop").iterdir() if p.is_dir()]
    steps = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert all(s["cache_write_tokens"] is not None and s["cached_prompt_tokens"] is not None for s in steps)
    assert all(s["thinking_tokens_source"] == "api" for s in steps)
    system = min(s["cached_prompt_tokens"] for s in steps if s["cached_prompt_tokens"])  # tools and system, read by all
    prompts = {row["prompt_sha256"]: row["messages"] for row in map(json.loads, (run_dir / "prompts.jsonl").read_text().splitlines())}
    previous = {(s["rollout_id"], s["step"] + 1): s for s in steps}
    # a step whose previous prompt ended with a bar after a tool result: append keeps that bar in place (the
    # harness's append drops a bar that followed a user message), replace removes it
    followed = [(s, previous[s["rollout_id"], s["step"]]) for s in steps if (s["rollout_id"], s["step"]) in previous
                and prompts[previous[s["rollout_id"], s["step"]]["prompt_sha256"]][-2]["role"] == "tool"]
    append = [(s, p) for s, p in followed if s["condition"] == "status_append"]
    replace = [(s, p) for s, p in followed if s["condition"] == "status_tail"]
    assert len(append) >= 4 and len(replace) >= 4
    assert all(s["cached_prompt_tokens"] == p["prompt_tokens"] for s, p in append)  # the whole previous prompt read back
    assert all(s["cached_prompt_tokens"] == system for s, p in replace)  # only the tools and system prompt
    report = (run_dir / "report.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in report.splitlines()
            if line.startswith("| status_") and "append" in line or line.startswith("| status_tail ") and "replace" in line}
    reused = {k: float(v[-3].rstrip("%")) for k, v in rows.items()}
    assert reused["status_append"] > 50 > 20 > reused["status_tail"], rows


def _next_step(req):
    """The request's next step under the replace strategy: the bar removed, a call and its result
    added, a new bar at the end."""
    bar = req.messages[-1]
    call = {"id": "c9", "type": "function", "function": {"name": "web_search", "arguments": '{"query": "outage"}'}}
    messages = req.messages[:-1] + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                    {"role": "tool", "tool_call_id": "c9", "name": "web_search", "content": "no outage"},
                                    {"role": "user", "content": bar["content"].replace("web_search: 2", "web_search: 3")}]
    return type(req)(**{**req.__dict__, "messages": messages})


@pytest.mark.parametrize("cache", ["end", "before_tail"])
def test_replace_misses_with_the_breakpoint_at_the_end_and_reads_the_stable_prefix_before_the_bar(cache):
    with AnthropicServer() as server:
        backend, requests = _backend(server, f"backend.cache={cache}", "condition=[status_tail]", "scenario.calls_made=[3]",
                                     "scenario.distractor_turns=[0]")
        first = backend.generate(requests[:1])[0]
        second = backend.generate([_next_step(requests[0])])[0]
    assert first.error is None and second.error is None
    sent = server.requests[0]
    system = sum(tokens({k: v for k, v in b.items() if k != "cache_control"}) for b in sent["tools"] + sent["system"])
    if cache == "end":  # the stored prefix ends with the bar the next step removed: only tools and system are read
        assert second.cached_prompt_tokens == system
    else:  # the prefix through the block before the trailing user text (the question and the bar) was stored and is read
        assert first.cached_prompt_tokens == 0 and first.prompt_tokens - first.cache_write_tokens == sum(
            tokens({"role": "user", "type": "text", "text": m["content"]}) for m in requests[0].messages[-2:])
        assert second.cached_prompt_tokens == first.cache_write_tokens > system


def test_batch_partial_failure_and_expiry_are_error_records_and_batch_priced(tmp_path):
    with AnthropicServer() as server:
        backend, requests = _backend(server, "backend.batch=true", "backend.poll_s=0.01", "model=claude-haiku-4.5")
        backend.attach(tmp_path / "a")
        server.errored = {requests[1].sample_id}
        out = backend.generate(requests)
        assert [c.error is None for c in out] == [True, False, True] and all(c.batched for c in out)
        assert "invalid_request_error" in out[1].error
        server.expire = True
        backend.attach(tmp_path / "b")
        expired = backend.generate(requests)
    assert all("expired" in c.error for c in expired)
    from harness.measure.cost import cost_usd

    model = make_cfg("model=claude-haiku-4.5").model
    listed = cost_usd(model, type(out[0])(**{**out[0].__dict__, "batched": False}))
    assert cost_usd(model, out[0]) == pytest.approx(listed * model.batch_discount)


def test_batch_mode_is_refused_for_rollouts():
    with pytest.raises(ConfigError, match="backend.batch: a rollout's step depends"):
        make_cfg("experiment=agent_loop", "backend=anthropic", "backend.api_key_env=null", "backend.batch=true")
