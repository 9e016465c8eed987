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
from typing import Any, ClassVar

from harness.backends.openai_wire import (NEUTRAL_PENALTIES, completions_kwargs, get_field, merge_tool_call_deltas,
                                          parse_response, parse_responses, parse_text_completion, request_id,
                                          request_kwargs, responses_kwargs, to_completion)
from harness.backends.remote import RemoteBackend, RemoteBackendConfig
from harness.config.schemas import ModelConfig, require
from harness.errors import ConfigError
from harness.types import Completion, Request



class Api(StrEnum):
    chat = "chat"  # /v1/chat/completions
    responses = "responses"  # /v1/responses (OpenAI's Responses API)
    completions = "completions"  # /v1/completions with the prompt rendered here


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
            self._reported(get_field(resp, "model"))
            return parse_responses(resp, time.perf_counter() - t0, clean=self.clean)
        if api == Api.completions:
            c = await (self._stream_text(client, kwargs, t0) if self.cfg.stream else self._text(client, kwargs, t0))
            c.prompt_text = kwargs["prompt"]
            return c
        if self.cfg.stream:
            return await self._stream(client, kwargs, t0)
        resp = await client.chat.completions.create(**kwargs)
        self._reported(get_field(resp, "model"))
        return parse_response(resp, time.perf_counter() - t0, self.clean)

    async def _text(self, client: Any, kwargs: dict[str, Any], t0: float) -> Completion:
        resp = await client.completions.create(**kwargs)
        self._reported(get_field(resp, "model"))
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
                self._reported(get_field(chunk, "model"))
                rid = request_id(chunk)
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices or []:
                delta = choice.delta
                piece = delta.content or ""
                thought = get_field(delta, "reasoning_content") or get_field(delta, "reasoning") or ""
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
                self._reported(get_field(chunk, "model"))
                rid = request_id(chunk)
            usage = get_field(chunk, "usage") or usage
            for choice in get_field(chunk, "choices") or []:
                piece = get_field(choice, "text") or ""
                if ttft is None and piece:
                    ttft = time.perf_counter() - t0
                text.append(piece)
                finish = get_field(choice, "finish_reason") or finish
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
            kind = get_field(event, "type") or ""
            if ttft is None and kind.endswith(".delta"):
                ttft = time.perf_counter() - t0
            if kind in ("response.completed", "response.incomplete"):
                final = get_field(event, "response")
            elif kind in ("response.failed", "error"):
                raise ValueError(f"the response failed: {self.clean(str(get_field(event, 'response') or event))[:300]}")
        if final is None:
            return self._streamed(events, None, "", t0, ttft)
        self._reported(get_field(final, "model"))
        return parse_responses(final, time.perf_counter() - t0, ttft, self.clean)
