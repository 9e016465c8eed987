"""Anthropic's Messages API through the official `anthropic` SDK (pip install -e ".[anthropic]").

Our messages are OpenAI chat format; the Messages API takes:
- the leading system message(s) as `system`; a later system message stays where it is: `role: system` in
  `messages` right after a user turn (the newer models take it there; an older one answers 400, an error
  record), user text elsewhere (after an assistant turn, where the API takes no system message);
- each tool call as a `tool_use` block of its assistant message (arguments decoded to an object), each
  result as a `tool_result` block of the next user message; consecutive messages of one role merge
  into one message of blocks (a tool result and the status bar after it are one user message);
- the tools as `{name, description, input_schema}`.

Prompt caching (backend.cache): a breakpoint (`cache_control: {"type": "ephemeral"}`) on the system
prompt (the tools come before it, so both are read back on every later request), and one in the
messages: `end` (default), on the last block of the request, as an agent loop offers its whole prompt
to the next step: a step that repeats the previous prompt and adds to it (the `append` bar update)
reads all of it back from the cache; one that removed the previous bar (`replace`) diverges where the
bar was and reads only the system prompt. `before_tail`: on the last block before the prompt's
trailing user text (the bar), so the stable part is cached whatever the bar does; `none`: no breakpoint.

Thinking, as the model preset's thinking_control says: `effort` sends adaptive thinking with
`output_config.effort` = model.generation.reasoning_effort, `budget` manual extended thinking with
`budget_tokens` = model.generation.thinking_budget; the thinking text (summarized, as
backend.thinking_display asks) is kept as the record's reasoning, its token count taken from the
usage's `output_tokens_details.thinking_tokens` (`api`). Per request the record holds input,
cache-write (`cache_creation_input_tokens`), cache-read (`cache_read_input_tokens`), output and thinking
tokens, the stop reason (max_tokens as `length`, end_turn as `stop`, tool_use as `tool_calls`) and the
request id. Retries (429, 529 overloaded, 5xx), timeouts, size caps, redaction and batch mode are
harness.backends.remote's and harness.backends.batch's.

Not carried across the steps of a rollout: the thinking blocks' signatures (our history keeps the
thinking text only), which the API wants back after a tool call when thinking is on: such a step is
answered with a 400, an error record.
"""
from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Optional

from harness.backends.batch import BatchApi, Status
from harness.backends.remote import RemoteBackend, RemoteBackendConfig, usage_counts
from harness.config.schemas import ModelConfig, ThinkingControl, require
from harness.context.calls import call_arguments
from harness.errors import ConfigError
from harness.types import Completion, Message, Request

CACHED = {"type": "ephemeral"}
# the Messages API's stop reasons under the names the graders read (a cut answer is `length`)
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


class CacheAt(StrEnum):
    end = "end"  # the last block of the request: the next step reads back what it repeats
    before_tail = "before_tail"  # the last block before the trailing user text (the bar)
    none = "none"


class ThinkingDisplay(StrEnum):
    summarized = "summarized"  # the thinking text comes back (summarized by the newer models)
    omitted = "omitted"  # only a signature comes back


@dataclass
class AnthropicBackendConfig(RemoteBackendConfig):
    name: str = "anthropic"
    base_url: str = "https://api.anthropic.com"
    api_key_env: Optional[str] = "ANTHROPIC_API_KEY"
    cache: CacheAt = CacheAt.end
    # sent with a thinking setting; null: the model's own default (some newer models omit the text)
    thinking_display: Optional[ThinkingDisplay] = ThinkingDisplay.summarized

    def __post_init__(self) -> None:
        super().__post_init__()
        require(not (self.batch and self.stream), "backend.stream", "a batch API does not stream: set backend.stream=false")

    def check_machine(self) -> None:
        require(importlib.util.find_spec("anthropic") is not None, "backend", 'backend=anthropic needs the anthropic SDK: '
                'pip install -e ".[anthropic]"')
        super().check_machine()


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A message's text as blocks: the API refuses an empty text block."""
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = call_arguments(call)
    except ConfigError as exc:  # a call the model wrote badly, in the history: this sample cannot be sent as tool_use
        raise ValueError(str(exc)) from None
    return {"type": "tool_use", "id": call.get("id") or "", "name": call["function"]["name"], "input": arguments}


def to_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, messages) for the Messages API (see the module's docstring)."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    leading = True
    for m in messages:
        role = m["role"]
        if role == "system" and leading:
            system += _blocks(m.get("content"))
            continue
        leading = False
        if role == "system" and not (out and out[-1]["role"] == "user"):
            role = "user"  # the API takes a later system message only right after a user turn; elsewhere it is user text
        if role == "tool":
            role, blocks = "user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id") or "",
                                     "content": m.get("content") or ""}]
        else:
            blocks = _blocks(m.get("content")) + [_tool_use(c) for c in (m.get("tool_calls") or []) if role == "assistant"]
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return system, out


def to_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}}} for t in tools]


def mark_cache(system: list[dict[str, Any]], tools: list[dict[str, Any]], messages: list[dict[str, Any]], at: CacheAt) -> None:
    """Place the cache breakpoints (in place): the system prompt (else the last tool), and one in the messages."""
    if at == CacheAt.none:
        return
    head = system or tools
    if head:
        head[-1]["cache_control"] = dict(CACHED)
    blocks = [b for m in messages for b in m["content"]]
    if at == CacheAt.before_tail:
        last = messages[-1]["content"] if messages else []
        tail = 0
        while tail < len(last) and last[len(last) - 1 - tail]["type"] == "text" and messages[-1]["role"] == "user":
            tail += 1
        blocks = blocks[:len(blocks) - tail]
    if blocks:
        blocks[-1]["cache_control"] = dict(CACHED)


def thinking_kwargs(model_cfg: ModelConfig, req: Request, display: ThinkingDisplay | None) -> dict[str, Any]:
    """The thinking setting as the model's preset says it takes one (none where nothing is set)."""
    gen = req.generation
    shown = {"display": str(display)} if display else {}
    if gen.thinking_budget is not None:
        return {"thinking": {"type": "enabled", "budget_tokens": gen.thinking_budget, **shown}}
    if gen.reasoning_effort is not None:
        return {"thinking": {"type": "adaptive", **shown}, "output_config": {"effort": gen.reasoning_effort}}
    if model_cfg.thinking and model_cfg.thinking_control == ThinkingControl.effort:  # thinking on, the API's own effort
        return {"thinking": {"type": "adaptive", **shown}}
    return {}


def request_kwargs(model: str, model_cfg: ModelConfig, req: Request, cfg: AnthropicBackendConfig) -> dict[str, Any]:
    """The messages.create arguments for one request (a batch request's params too, less `stream`)."""
    gen = req.generation
    system, messages = to_messages(req.messages)
    tools = to_tools(req.tools)
    mark_cache(system, tools, messages, cfg.cache)
    kwargs: dict[str, Any] = {"model": model, "max_tokens": gen.max_new_tokens, "messages": messages}
    if system:
        kwargs["system"] = system
    if tools:
        kwargs["tools"] = tools
    kwargs.update(thinking_kwargs(model_cfg, req, cfg.thinking_display))
    extra = {}
    if model_cfg.sampling_params:  # older models only; the SDK no longer names these fields, so they go as extra body
        extra["temperature"] = gen.temperature
        if gen.top_p < 1.0:
            extra["top_p"] = gen.top_p
        if gen.top_k and not gen.greedy:
            extra["top_k"] = gen.top_k
    extra.update(cfg.extra_body)
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def parse_message(msg: Any, latency: float | None, ttft: float | None = None, clean: Callable[[str], str] = str) -> Completion:
    """A Message as a Completion; ValueError when the server's 200 is not one."""
    content = _get(msg, "content") if not isinstance(msg, (str, bytes)) else None
    if not isinstance(content, list):
        raise ValueError(f"response is not a message: {clean(str(msg))[:200]!r}")
    text, reasoning, calls, thought = [], [], [], False
    for block in content:
        kind = _get(block, "type")
        if kind == "text":
            text.append(_get(block, "text") or "")
        elif kind in ("thinking", "redacted_thinking"):
            thought = True
            reasoning.append(_get(block, "thinking") or "")
        elif kind == "tool_use":
            calls.append({"id": _get(block, "id"), "type": "function",
                          "function": {"name": _get(block, "name"), "arguments": json.dumps(_get(block, "input") or {}, ensure_ascii=False)}})
    usage = _get(msg, "usage")
    u = usage_counts({"input_tokens": _get(usage, "input_tokens"), "cache_write": _get(usage, "cache_creation_input_tokens"),
                      "cache_read": _get(usage, "cache_read_input_tokens"), "output_tokens": _get(usage, "output_tokens"),
                      "thinking": _get(_get(usage, "output_tokens_details"), "thinking_tokens")},
                     (("thinking", "output_tokens", "thinking"),))
    prompt = None if u["input_tokens"] is None else u["input_tokens"] + (u["cache_write"] or 0) + (u["cache_read"] or 0)
    thinking, source = u["thinking"], "api"
    if thinking is None:  # an older model's usage: 0 only where no thinking came back
        thinking, source = (0, "estimated") if not thought and u["output_tokens"] is not None else (None, None)
    stop = _get(msg, "stop_reason")
    rid = getattr(msg, "_request_id", None) or _get(msg, "id")
    return Completion(text="".join(text), reasoning="\n".join(r for r in reasoning if r), tool_calls=calls,
                      prompt_tokens=prompt, cached_prompt_tokens=u["cache_read"], cache_write_tokens=u["cache_write"],
                      completion_tokens=u["output_tokens"], thinking_tokens=thinking,
                      answer_tokens=u["output_tokens"] - thinking if None not in (u["output_tokens"], thinking) else None,
                      thinking_tokens_source=source, latency_s=latency, ttft_s=ttft,
                      finish_reason=STOP_REASONS.get(stop, stop), request_id=rid if isinstance(rid, str) else None)


class AnthropicBackend(RemoteBackend):
    config_class = AnthropicBackendConfig
    name = "anthropic"
    label = "anthropic"

    def __init__(self, model_cfg: ModelConfig, cfg: AnthropicBackendConfig, transport_factory: Any = None):
        try:
            import anthropic  # noqa: F401  (checked here: a missing SDK is one line, not a traceback mid-run)
        except ImportError:
            raise ConfigError('backend=anthropic needs the anthropic SDK: pip install -e ".[anthropic]"') from None
        super().__init__(model_cfg, cfg, transport_factory)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "cache": str(self.cfg.cache)}

    def _client(self) -> Any:
        import anthropic

        return anthropic.AsyncAnthropic(base_url=self.cfg.base_url, api_key=self.key or "unused", max_retries=self.cfg.max_retries,
                                        timeout=self.cfg.timeout_s,
                                        http_client=self.http_client(anthropic.DefaultAsyncHttpxClient, anthropic.AnthropicError))

    def body(self, req: Request) -> dict[str, Any]:
        return request_kwargs(self.model, self.model_cfg, req, self.cfg)

    async def _call(self, client: Any, req: Request, t0: float) -> Completion:
        kwargs = self.body(req)
        if not self.cfg.stream:
            msg = await client.messages.create(**kwargs)
            self._reported(_get(msg, "model"))
            return parse_message(msg, time.perf_counter() - t0, clean=self.clean)
        ttft = None
        async with client.messages.stream(**kwargs) as stream:
            async for event in stream:
                if ttft is None and _get(event, "type") == "content_block_delta":
                    ttft = time.perf_counter() - t0
            msg = await stream.get_final_message()
            rid = stream.request_id
        self._reported(_get(msg, "model"))
        c = parse_message(msg, time.perf_counter() - t0, ttft, self.clean)
        c.request_id = rid or c.request_id
        return c

    def _batch(self) -> BatchApi:
        return AnthropicBatches(self._client, self.body, lambda msg: parse_message(msg, None, clean=self.clean))


class AnthropicBatches(BatchApi):
    """Anthropic's Message Batches: the requests' params in one call; results streamed as JSONL once
    the batch has ended (succeeded, errored, canceled or expired per request)."""

    provider = "anthropic"

    def __init__(self, client: Callable[[], Any], body: Callable[[Request], dict[str, Any]], parse: Callable[[Any], Completion]):
        self.client, self.body, self.parse = client, body, parse

    def params(self, req: Request) -> dict[str, Any]:
        params = self.body(req)
        params.update(params.pop("extra_body", {}))
        return params

    async def submit(self, client: Any, requests: list[Request], submission: str) -> str:
        batch = await client.messages.batches.create(requests=[{"custom_id": r.sample_id, "params": self.params(r)} for r in requests])
        return batch.id

    async def poll(self, client: Any, batch_id: str) -> Status:
        b = await client.messages.batches.retrieve(batch_id)
        c = b.request_counts
        total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
        return Status(b.processing_status == "ended", total - c.processing, total, b.processing_status, batch=b)

    async def results(self, client: Any, status: Status, requests: list[Request]) -> dict[str, Completion]:
        out: dict[str, Completion] = {}
        async for entry in await client.messages.batches.results(status.batch.id):
            result = entry.result
            if result.type == "succeeded":
                try:
                    out[entry.custom_id] = self.parse(result.message)
                except ValueError as exc:
                    out[entry.custom_id] = Completion(error=f"anthropic batch: {exc}")
            elif result.type == "errored":
                err = _get(result.error, "error")
                out[entry.custom_id] = Completion(error=f"anthropic batch: {_get(err, 'type')}: {_get(err, 'message')}",
                                                  request_id=_get(result.error, "request_id"))
            else:  # canceled, expired (not processed within 24 h)
                out[entry.custom_id] = Completion(error=f"anthropic batch: the request was {result.type} before it ran")
        return out
