"""Any OpenAI-compatible server: vllm serve, transformers serve, llama.cpp's server, OpenAI's own API.

`backend.api` picks the endpoint:
- `chat` (default): /v1/chat/completions; the server renders its own chat template.
- `responses`: OpenAI's Responses API (/v1/responses): tool calls and their results as `function_call` /
  `function_call_output` items, reasoning effort as `reasoning.effort`, reasoning and cached tokens from
  its usage, the reasoning summary kept as the record's reasoning.
- `completions`: /v1/completions with the prompt the hf backend's record holds (the model's tokenizer
  renders its chat template here, harness.render), for servers that render templates their own way
  (llama.cpp's double-encodes Qwen's call arguments); at temperature 0 the penalties in
  backend.neutral_penalties go out explicitly neutral (llama.cpp applies repeat_penalty 1.1 by default).

Requests of a batch run concurrently (bounded by backend.concurrency); retries, deadline, size cap,
redaction and error records are harness.backends.remote's. A 400 (e.g. a template that rejects the
prompt) is an error record at once, carrying the server's message, as is a 200 that is not an answer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, ClassVar

from harness.backends.remote import RemoteBackend, RemoteBackendConfig, usage_counts
from harness.config.schemas import ModelConfig, require
from harness.errors import ConfigError
from harness.render import chat_input, split_thinking, thinking_span
from harness.types import Completion, GenerationSettings, Request



class Api(StrEnum):
    chat = "chat"  # /v1/chat/completions
    responses = "responses"  # /v1/responses (OpenAI's Responses API)
    completions = "completions"  # /v1/completions with the prompt rendered here


# each penalty a server may apply by default, at its neutral value: OpenAI's two at 0.0, llama.cpp's
# repeat_penalty and vLLM's repetition_penalty at 1.0
NEUTRAL_PENALTIES = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0}


@dataclass
class OpenAIBackendConfig(RemoteBackendConfig):
    """Any OpenAI-compatible server (vllm serve, transformers serve, llama.cpp, OpenAI's API)."""

    name: str = "openai"
    api: Api = Api.chat
    # api=completions, temperature 0: these penalties sent at their neutral values (NEUTRAL_PENALTIES), so a
    # server's own default cannot make greedy decoding something else; a server that refuses a field it does
    # not know (transformers serve: 422) takes fewer: backend.neutral_penalties=[frequency_penalty,presence_penalty]
    neutral_penalties: list[str] = field(default_factory=lambda: list(NEUTRAL_PENALTIES))
    OPERATIONAL: ClassVar[frozenset[str]] = RemoteBackendConfig.OPERATIONAL

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [p for p in self.neutral_penalties if p not in NEUTRAL_PENALTIES]
        require(not unknown, "backend.neutral_penalties", f"unknown penalty {unknown[0] if unknown else ''!r}; known: "
                f"{', '.join(NEUTRAL_PENALTIES)}")
        require(not (self.batch and self.stream), "backend.stream", "a batch API does not stream: set backend.stream=false")

    def takes_thinking_settings(self) -> bool:
        return self.api != Api.completions  # /v1/completions has no field for them

    def identity(self) -> dict[str, Any]:
        """api and neutral_penalties only where they apply, so runs from before they existed keep their ids."""
        identity = super().identity()
        if self.api == Api.chat:
            del identity["api"]
        if self.api != Api.completions:
            del identity["neutral_penalties"]
        return identity


def sampling_kwargs(gen: GenerationSettings, sampling: bool) -> dict[str, Any]:
    """temperature and top_p as every endpoint takes them; none for a model whose API refuses them
    (ModelConfig.sampling_params, whose settings then equal the API's own)."""
    if not sampling:
        return {}
    return {"temperature": gen.temperature, **({"top_p": gen.top_p} if gen.top_p < 1.0 else {})}


def request_kwargs(model: str, req: Request, chat_template_kwargs: dict[str, Any], extra_body: dict[str, Any],
                   stream: bool, hermes: bool = False, sampling: bool = True) -> dict[str, Any]:
    """The chat.completions.create arguments for one request. Only non-default top_k/min_p go out
    (in extra_body), since OpenAI's own API rejects them while vLLM and transformers serve accept them.
    With `hermes` (model.tool_format=hermes) tool traffic goes as text, for served templates without tools."""
    gen: GenerationSettings = req.generation
    messages, tools = chat_input(req.messages, req.tools, native=not hermes)  # the server renders its own template
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": gen.max_new_tokens,
                              **sampling_kwargs(gen, sampling), "seed": req.seed}
    if tools:
        kwargs["tools"] = tools
    if gen.reasoning_effort:
        kwargs["reasoning_effort"] = gen.reasoning_effort
    extra = {**extra_body, **sampled_extras(gen)}
    if chat_template_kwargs:
        extra["chat_template_kwargs"] = dict(chat_template_kwargs)
    return with_body(kwargs, extra, stream)


def sampled_extras(gen: GenerationSettings) -> dict[str, Any]:
    """top_k and min_p where sampling uses them (an extra body: OpenAI's own API rejects them)."""
    return {**({"top_k": gen.top_k} if gen.top_k and not gen.greedy else {}),
            **({"min_p": gen.min_p} if gen.min_p and not gen.greedy else {})}


def with_body(kwargs: dict[str, Any], extra: dict[str, Any], stream: bool) -> dict[str, Any]:
    """`kwargs` with the extra body and, when streaming, the usage asked for in the last chunk."""
    if extra:
        kwargs["extra_body"] = extra
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def responses_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: each call an item of its own (`function_call`), each
    result a `function_call_output` naming the call it answers."""
    items: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id") or "", "output": content})
            continue
        if content or not m.get("tool_calls"):
            items.append({"role": role, "content": content})
        for c in m.get("tool_calls") or []:
            items.append({"type": "function_call", "call_id": c.get("id") or "", "name": c["function"]["name"],
                          "arguments": c["function"]["arguments"]})
    return items


def responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat tool schemas (`{"type": "function", "function": {...}}`) as the Responses API takes them (flat)."""
    return [{"type": "function", **t["function"]} for t in tools]


def responses_kwargs(model: str, req: Request, extra_body: dict[str, Any], stream: bool, sampling: bool = True,
                     thinking: bool = False) -> dict[str, Any]:
    """The responses.create arguments; a thinking model (or a set effort) asks for the reasoning summary,
    the only thinking text the API returns."""
    gen = req.generation
    kwargs: dict[str, Any] = {"model": model, "input": responses_input(req.messages), "max_output_tokens": gen.max_new_tokens,
                              **sampling_kwargs(gen, sampling), "store": False}
    if req.tools:
        kwargs["tools"] = responses_tools(req.tools)
    if gen.reasoning_effort or thinking:
        kwargs["reasoning"] = {"summary": "auto", **({"effort": gen.reasoning_effort} if gen.reasoning_effort else {})}
    if extra_body:
        kwargs["extra_body"] = dict(extra_body)
    if stream:
        kwargs["stream"] = True
    return kwargs


def completions_kwargs(model: str, prompt: str, req: Request, extra_body: dict[str, Any], neutral: list[str],
                       stream: bool) -> dict[str, Any]:
    gen = req.generation
    kwargs: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": gen.max_new_tokens,
                              **sampling_kwargs(gen, True), "seed": req.seed}
    neutral_values = {name: NEUTRAL_PENALTIES[name] for name in neutral} if gen.greedy else {}
    return with_body(kwargs, {**neutral_values, **sampled_extras(gen), **extra_body}, stream)


def _get(obj: Any, name: str) -> Any:
    """A field of a pydantic response object (or a dict), including extras the schema does not declare
    (reasoning_content / reasoning are vLLM and DeepSeek extensions)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


# a part larger than its whole makes every count of the sample unknown (remote.usage_counts)
PARTS = (("cached_prompt_tokens", "prompt_tokens", "cached"), ("cache_write_tokens", "prompt_tokens", "cache-write"),
         ("reasoning_tokens", "completion_tokens", "reasoning"))


def _usage_fields(usage: Any, prompt: str = "prompt_tokens", completion: str = "completion_tokens") -> dict[str, int | None]:
    """A usage's prompt, cached, cache-write, completion and reasoning tokens; chat and text completions
    name them prompt/completion, the Responses API input/output (`prompt`, `completion`)."""
    prompt_details = _get(usage, f"{prompt}_details")
    return usage_counts({"prompt_tokens": _get(usage, prompt),
                         "cached_prompt_tokens": _get(prompt_details, "cached_tokens"),
                         "cache_write_tokens": _get(prompt_details, "cache_write_tokens"),  # OpenAI bills cache writes since GPT-5.6
                         "completion_tokens": _get(usage, completion),
                         "reasoning_tokens": _get(_get(usage, f"{completion}_details"), "reasoning_tokens")}, PARTS)


def shaped(content: str, reasoning: str, tool_calls: list[dict[str, Any]], u: dict[str, int | None],
           finish_reason: str | None, latency: float, ttft: float | None, **fields: Any) -> Completion:
    """One answer as a Completion. A server that returns thinking inline gets it split from the
    `<think>` block; `text` keeps what the server returned as content so grading sees the same answer
    the server gave. The thinking count is the usage's (`api`); where the usage has none and no thinking
    was returned, 0 read off the visible answer (`estimated`); else unknown."""
    if not reasoning:
        reasoning = split_thinking(content)[0]
    thinking, source = u["reasoning_tokens"], "api"
    if thinking is None:
        source = None
        if u["completion_tokens"] is not None and not reasoning:
            thinking, source = 0, "estimated"  # nothing was reasoned in what came back: every token is answer
    answer = u["completion_tokens"] - thinking if u["completion_tokens"] is not None and thinking is not None else None
    return Completion(text=content, reasoning=reasoning, tool_calls=tool_calls, prompt_tokens=u["prompt_tokens"],
                      cached_prompt_tokens=u["cached_prompt_tokens"], completion_tokens=u["completion_tokens"],
                      thinking_tokens=thinking, answer_tokens=answer, latency_s=latency, finish_reason=finish_reason,
                      ttft_s=ttft, thinking_tokens_source=source, cache_write_tokens=u["cache_write_tokens"], **fields)


def to_completion(content: str, reasoning: str, tool_calls: list[dict[str, Any]], usage: Any,
                  finish_reason: str | None, latency: float, ttft: float | None, **fields: Any) -> Completion:
    """A chat completion (assembled from a stream or not) as a Completion (`shaped`)."""
    return shaped(content, reasoning, tool_calls, _usage_fields(usage), finish_reason, latency, ttft, **fields)


def request_id(resp: Any) -> str | None:
    """The provider's id of a request: its request-id header where the SDK kept it, else the response's id."""
    rid = getattr(resp, "_request_id", None) or _get(resp, "id")
    return rid if isinstance(rid, str) else None


def _call_dict(call: Any) -> dict[str, Any]:
    fn = _get(call, "function")
    return {"id": _get(call, "id"), "type": "function", "function": {"name": _get(fn, "name"), "arguments": _get(fn, "arguments")}}


def merge_tool_call_deltas(calls: dict[int, dict[str, Any]], deltas: list[Any]) -> None:
    """Streamed tool calls arrive in pieces keyed by index: id and name once, arguments in fragments."""
    for d in deltas:
        call = calls.setdefault(d.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if d.id:
            call["id"] = d.id
        if d.function is not None:
            call["function"]["name"] += d.function.name or ""
            call["function"]["arguments"] += d.function.arguments or ""


def _string(value: Any, what: str) -> str:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value or ""


def _first_choice(resp: Any, kind: str, clean: Callable[[str], str]) -> Any:
    choices = _get(resp, "choices") if not isinstance(resp, (str, bytes)) else None
    if not isinstance(choices, list):
        raise ValueError(f"response is not a {kind}: {clean(str(resp))[:200]!r}")
    if not choices:
        raise ValueError("response has no choices")
    return choices[0]


def parse_response(resp: Any, latency: float, clean: Callable[[str], str] = str) -> Completion:
    """A non-streamed chat completion as a Completion; ValueError when the server's 200 is not one (an
    HTML page, `message: null`), so only this sample fails. Its body is quoted `clean`ed (redacted)
    first, then cut: a cut first would leave part of a key."""
    choice = _first_choice(resp, "chat completion", clean)
    msg = _get(choice, "message")
    if msg is None:
        raise ValueError("response choice has no message")
    content = _string(_get(msg, "content"), "message.content")
    reasoning = _string(_get(msg, "reasoning_content") or _get(msg, "reasoning"), "message reasoning")
    return to_completion(content, reasoning, [_call_dict(c) for c in _get(msg, "tool_calls") or []],
                         _get(resp, "usage"), _get(choice, "finish_reason"), latency, None, request_id=request_id(resp))


def parse_text_completion(resp: Any, latency: float, count: Callable[[str], int], clean: Callable[[str], str] = str) -> Completion:
    """A /v1/completions answer. Its thinking, where the text holds a `<think>` block, is counted by
    re-tokenizing that block with the model's tokenizer (`estimated`: the server returns no ids)."""
    choice = _first_choice(resp, "text completion", clean)
    text = _string(_get(choice, "text"), "choices[0].text")
    u = _usage_fields(_get(resp, "usage"))
    c = to_completion(text, "", [], _get(resp, "usage"), _get(choice, "finish_reason"), latency, None, request_id=request_id(resp))
    if u["completion_tokens"] is not None:
        thinking = min(count(thinking_span(text)), u["completion_tokens"])
        c.thinking_tokens, c.answer_tokens, c.thinking_tokens_source = thinking, u["completion_tokens"] - thinking, "estimated"
    return c


def parse_responses(resp: Any, latency: float, ttft: float | None = None, clean: Callable[[str], str] = str) -> Completion:
    """A Responses API answer: output text from `message` items, the reasoning summary (or the
    reasoning text, where a server returns it) from `reasoning` items, calls from `function_call` items."""
    output = _get(resp, "output") if not isinstance(resp, (str, bytes)) else None
    if not isinstance(output, list):
        raise ValueError(f"response is not a Responses API response: {clean(str(resp))[:200]!r}")
    text, reasoning, calls = [], [], []
    for item in output:
        kind = _get(item, "type")
        if kind == "message":
            text += [_string(_get(part, "text"), "output_text") for part in _get(item, "content") or []
                     if _get(part, "type") == "output_text"]
        elif kind == "reasoning":
            reasoning += [_string(_get(part, "text"), "reasoning text") for part in
                          (_get(item, "summary") or []) + (_get(item, "content") or [])]
        elif kind == "function_call":
            calls.append({"id": _get(item, "call_id"), "type": "function",
                          "function": {"name": _string(_get(item, "name"), "function_call.name"),
                                       "arguments": _string(_get(item, "arguments"), "function_call.arguments")}})
    incomplete = _get(_get(resp, "incomplete_details"), "reason")
    finish = "length" if incomplete == "max_output_tokens" else incomplete or ("tool_calls" if calls else "stop")
    return shaped("".join(text), "\n".join(r for r in reasoning if r), calls,
                  _usage_fields(_get(resp, "usage"), "input_tokens", "output_tokens"), finish,
                  latency, ttft, request_id=request_id(resp))


class OpenAIBackend(RemoteBackend):
    config_class = OpenAIBackendConfig
    name = "openai"
    label = "openai"

    def __init__(self, model_cfg: ModelConfig, cfg: OpenAIBackendConfig, transport_factory: Any = None):
        super().__init__(model_cfg, cfg, transport_factory)
        self.renderer = self.count = None
        if cfg.api == Api.completions:
            self._load_renderer()

    def _load_renderer(self) -> None:
        """The model's tokenizer, to render the prompt the hf backend's record holds and count thinking."""
        from transformers import AutoTokenizer

        from harness.models import sources
        from harness.render import PromptRenderer

        path, revision = sources.resolve(self.model_cfg)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, revision=revision if not self.model_cfg.packaged else None)
        except OSError as exc:
            raise ConfigError(f"backend.api=completions renders the prompt with model {self.model_cfg.name}'s tokenizer, "
                              f"which does not load from {path!r}: {str(exc).splitlines()[0]}") from None
        self.renderer = PromptRenderer(tokenizer, self.model_cfg)
        self.count = lambda text: len(tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "api": str(self.cfg.api)}

    def _client(self) -> Any:
        import openai

        # local servers ignore the key, but the client insists on one
        return openai.AsyncOpenAI(base_url=self.cfg.base_url, api_key=self.key or "unused", max_retries=self.cfg.max_retries,
                                  timeout=self.cfg.timeout_s, http_client=self.http_client(openai.DefaultAsyncHttpxClient, openai.OpenAIError))

    def body(self, req: Request) -> dict[str, Any]:
        """The request's arguments for the configured endpoint (what a batch file's line holds too)."""
        cfg, sampling, stream = self.cfg, self.model_cfg.sampling_params, self.cfg.stream
        if cfg.api == Api.responses:
            return responses_kwargs(self.model, req, cfg.extra_body, stream, sampling, self.model_cfg.thinking)
        if cfg.api == Api.completions:
            return completions_kwargs(self.model, self.prompt(req), req, cfg.extra_body, cfg.neutral_penalties, stream)
        return request_kwargs(self.model, req, self.model_cfg.chat_template_kwargs, cfg.extra_body, stream,
                              hermes=self.model_cfg.tool_format == "hermes", sampling=sampling)

    def prompt(self, req: Request) -> str:
        return self.renderer(req.messages, req.tools)

    async def _call(self, client: Any, req: Request, t0: float) -> Completion:
        kwargs = self.body(req)
        api = self.cfg.api
        if api == Api.responses:
            if self.cfg.stream:
                return await self._stream_responses(client, kwargs, t0)
            resp = await client.responses.create(**kwargs)
            self._reported(_get(resp, "model"))
            return parse_responses(resp, time.perf_counter() - t0, clean=self.clean)
        if api == Api.completions:
            c = await (self._stream_text(client, kwargs, t0) if self.cfg.stream else self._text(client, kwargs, t0))
            c.prompt_text = kwargs["prompt"]
            return c
        if self.cfg.stream:
            return await self._stream(client, kwargs, t0)
        resp = await client.chat.completions.create(**kwargs)
        self._reported(_get(resp, "model"))
        return parse_response(resp, time.perf_counter() - t0, self.clean)

    async def _text(self, client: Any, kwargs: dict[str, Any], t0: float) -> Completion:
        resp = await client.completions.create(**kwargs)
        self._reported(_get(resp, "model"))
        return parse_text_completion(resp, time.perf_counter() - t0, self.count, self.clean)

    def _batch(self) -> Any:
        from harness.backends.batch import OpenAIBatches

        path = {Api.chat: "/v1/chat/completions", Api.responses: "/v1/responses", Api.completions: "/v1/completions"}[self.cfg.api]
        parse = {Api.chat: lambda body: parse_response(body, 0.0, self.clean),
                 Api.responses: lambda body: parse_responses(body, 0.0, clean=self.clean),
                 Api.completions: lambda body: parse_text_completion(body, 0.0, self.count, self.clean)}[self.cfg.api]
        return OpenAIBatches(self._client, path, self.body, parse, self.prompt if self.cfg.api == Api.completions else None)

    async def _stream(self, client: Any, kwargs: dict[str, Any], t0: float) -> Completion:
        content, reasoning, calls = [], [], {}
        usage, finish, ttft, rid = None, None, None, None
        stream = await client.chat.completions.create(**kwargs)
        chunks = 0
        async for chunk in stream:
            chunks += 1
            if chunks == 1:
                self._reported(_get(chunk, "model"))
                rid = request_id(chunk)
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices or []:
                delta = choice.delta
                piece = delta.content or ""
                thought = _get(delta, "reasoning_content") or _get(delta, "reasoning") or ""
                if ttft is None and (piece or thought or delta.tool_calls):
                    ttft = time.perf_counter() - t0
                content.append(piece)
                reasoning.append(thought)
                merge_tool_call_deltas(calls, delta.tool_calls or [])
                finish = choice.finish_reason or finish
        return self._streamed(chunks, finish, "".join(content), t0, ttft) or to_completion(
            "".join(content), "".join(reasoning), [calls[i] for i in sorted(calls)], usage, finish, time.perf_counter() - t0, ttft,
            request_id=rid)

    def _streamed(self, chunks: int, finish: str | None, text: str, t0: float, ttft: float | None) -> Completion | None:
        """The error a stream ended in, or None when it carried a whole answer."""
        if not chunks:  # e.g. a 200 HTML page: no event at all is not an empty answer
            kind = {Api.chat: "chat completion chunks", Api.completions: "completion chunks"}.get(self.cfg.api, "Responses API events")
            raise ValueError(f"the stream carried no {kind}")
        if finish is None:  # the server closed the stream mid-answer: what arrived is not the model's answer
            return self.failed(f"stream ended without a finish reason after {len(text)} characters (connection closed "
                               "mid-answer?)", text=text, latency_s=time.perf_counter() - t0, ttft_s=ttft)
        return None

    async def _stream_text(self, client: Any, kwargs: dict[str, Any], t0: float) -> Completion:
        text, usage, finish, ttft, rid, chunks = [], None, None, None, None, 0
        async for chunk in await client.completions.create(**kwargs):
            chunks += 1
            if chunks == 1:
                self._reported(_get(chunk, "model"))
                rid = request_id(chunk)
            usage = _get(chunk, "usage") or usage
            for choice in _get(chunk, "choices") or []:
                piece = _get(choice, "text") or ""
                if ttft is None and piece:
                    ttft = time.perf_counter() - t0
                text.append(piece)
                finish = _get(choice, "finish_reason") or finish
        failed = self._streamed(chunks, finish, "".join(text), t0, ttft)
        if failed:
            return failed
        body = {"id": rid, "choices": [{"text": "".join(text), "finish_reason": finish}], "usage": usage}
        c = parse_text_completion(body, time.perf_counter() - t0, self.count, self.clean)
        c.ttft_s = ttft
        return c

    async def _stream_responses(self, client: Any, kwargs: dict[str, Any], t0: float) -> Completion:
        """Responses API events: the time to the first output delta, then the whole response from the
        `response.completed` (or `response.incomplete`) event, parsed as a non-streamed one."""
        ttft, final, events = None, None, 0
        async for event in await client.responses.create(**kwargs):
            events += 1
            kind = _get(event, "type") or ""
            if ttft is None and kind.endswith(".delta"):
                ttft = time.perf_counter() - t0
            if kind in ("response.completed", "response.incomplete"):
                final = _get(event, "response")
            elif kind in ("response.failed", "error"):
                raise ValueError(f"the response failed: {self.clean(str(_get(event, 'response') or event))[:300]}")
        if final is None:
            return self._streamed(events, None, "", t0, ttft)
        self._reported(_get(final, "model"))
        return parse_responses(final, time.perf_counter() - t0, ttft, self.clean)
