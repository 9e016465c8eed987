"""Any OpenAI-compatible chat-completions server: vllm serve, transformers serve, frontier APIs.

Requests of a batch run concurrently (bounded by backend.concurrency). Retries with exponential
backoff and jitter on 408/409/429/5xx, timeouts and dropped connections are the openai client's own
(backend.max_retries); what still fails, and any 400 at once (e.g. a template that rejects the
prompt), becomes an error record carrying the server's message, as does a 200 that is not a chat
completion or a request past its overall deadline (timeout_s x (max_retries + 1)). The API key is
read from the environment variable named by backend.api_key_env, lives only inside the client
object, and is redacted (any 12 consecutive characters of it) from every text the server returns:
content, reasoning, tool calls, finish reason and error bodies, before anything stores or prints them.
Lone surrogates in those texts become U+FFFD (harness.io.text).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Optional

from harness.backends import Backend
from harness.config.schemas import BackendConfig, ModelConfig, require
from harness.engine.prefix import prefix_key, prefix_order
from harness.io.secrets import looks_like_secret, redact
from harness.io.text import map_strings, whole_chars
from harness.io.validate import token_count
from harness.render import chat_input, split_thinking
from harness.types import Completion, GenerationSettings, Request

log = logging.getLogger(__name__)


@dataclass
class OpenAIBackendConfig(BackendConfig):
    """Any OpenAI-compatible chat-completions server (vllm serve, transformers serve, frontier APIs)."""

    name: str = "openai"
    base_url: str = "http://127.0.0.1:8000/v1"
    served_model: Optional[str] = None  # the server's model name; null = model.path, else model.name
    # name of the environment variable holding the key; the key itself never enters the config
    api_key_env: Optional[str] = "OPENAI_API_KEY"
    concurrency: int = 8  # requests in flight at once
    max_retries: int = 5  # openai client's own exponential backoff with jitter on 408/409/429/5xx/timeouts
    timeout_s: float = 300.0
    stream: bool = False  # on: time to first token is measured
    # a response's decoded body (a stream's included) past this many bytes is an error record, not read on:
    # memory stays bounded against a gzip bomb; 32 MB holds a streamed answer of ~100k tokens
    max_response_bytes: int = 32_000_000
    extra_body: dict[str, Any] = field(default_factory=dict)  # provider-specific request fields
    # a 3xx to another scheme, host or port would send the prompts there: refused unless set
    allow_cross_host_redirects: bool = False
    # transport only: base_url, served_model and extra_body decide the outputs and are identity
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"api_key_env", "concurrency", "max_retries", "timeout_s", "stream",
                                                     "max_response_bytes", "allow_cross_host_redirects"})

    def __post_init__(self) -> None:
        require(self.base_url.startswith(("http://", "https://")), "backend.base_url", f"must be an http(s) URL, got {self.base_url!r}")
        require(self.concurrency >= 1, "backend.concurrency", f"must be >= 1, got {self.concurrency}")
        require(self.max_retries >= 0, "backend.max_retries", f"must be >= 0, got {self.max_retries}")
        require(self.timeout_s > 0, "backend.timeout_s", f"must be > 0, got {self.timeout_s}")
        require(self.max_response_bytes >= 1, "backend.max_response_bytes", f"must be >= 1, got {self.max_response_bytes}")
        require(not (self.api_key_env and looks_like_secret(self.api_key_env)), "backend.api_key_env",  # the value is not repeated
                "must be the NAME of the environment variable holding the key; the value looks like a key itself")

    def check_machine(self) -> None:
        if self.api_key_env:
            require(bool(os.environ.get(self.api_key_env)), "backend.api_key_env",
                    f"environment variable {self.api_key_env} is not set (or set backend.api_key_env=null for a server without keys)")


def request_kwargs(model: str, req: Request, chat_template_kwargs: dict[str, Any], extra_body: dict[str, Any],
                   stream: bool, hermes: bool = False) -> dict[str, Any]:
    """The chat.completions.create arguments for one request. Only non-default top_k/min_p go out
    (in extra_body), since OpenAI's own API rejects them while vLLM and transformers serve accept them.
    With `hermes` (model.tool_format=hermes) tool traffic goes as text, for served templates without tools."""
    gen: GenerationSettings = req.generation
    messages, tools = chat_input(req.messages, req.tools, native=not hermes)  # the server renders its own template
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": gen.max_new_tokens,
                              "temperature": gen.temperature, "seed": req.seed}
    if gen.top_p < 1.0:
        kwargs["top_p"] = gen.top_p
    if tools:
        kwargs["tools"] = tools
    extra = dict(extra_body)
    if gen.top_k and not gen.greedy:
        extra["top_k"] = gen.top_k
    if gen.min_p and not gen.greedy:
        extra["min_p"] = gen.min_p
    if chat_template_kwargs:
        extra["chat_template_kwargs"] = dict(chat_template_kwargs)
    if extra:
        kwargs["extra_body"] = extra
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def _get(obj: Any, name: str) -> Any:
    """A field of a pydantic response object, including extras the schema does not declare
    (reasoning_content / reasoning are vLLM and DeepSeek extensions)."""
    if obj is None:
        return None
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


def _usage_fields(usage: Any) -> dict[str, int | None]:
    """Token counts of a response's usage. The client does not validate what the server sent: when
    one is not a count (a string, a bool, a float, negative) or they contradict each other (more
    cached than prompt tokens, more reasoning than completion tokens), every count of the sample is
    unknown (None), never a wrong number; the answer itself is kept."""
    fields = {"prompt_tokens": _get(usage, "prompt_tokens"),
              "cached_prompt_tokens": _get(_get(usage, "prompt_tokens_details"), "cached_tokens"),
              "completion_tokens": _get(usage, "completion_tokens"),
              "reasoning_tokens": _get(_get(usage, "completion_tokens_details"), "reasoning_tokens")}
    counts, bad = {}, []
    for k, v in fields.items():
        try:
            counts[k] = token_count(v, k)
        except ValueError:
            bad.append(f"usage.{k} is not a token count")  # the value is not logged: it is the server's text
    for part, whole, name in (("cached_prompt_tokens", "prompt_tokens", "cached"), ("reasoning_tokens", "completion_tokens", "reasoning")):
        if None not in (counts.get(part), counts.get(whole)) and counts[part] > counts[whole]:
            bad.append(f"{counts[part]} {name} tokens exceed the {counts[whole]} {whole.replace('_', ' ')}")
    if bad:
        log.warning("a response's usage is invalid (%s): this sample's token counts are unknown", "; ".join(bad))
        return dict.fromkeys(fields)
    return counts


def to_completion(content: str, reasoning: str, tool_calls: list[dict[str, Any]], usage: Any,
                  finish_reason: str | None, latency: float, ttft: float | None) -> Completion:
    """Shape one response (assembled from a stream or not) into a Completion.

    A server that returns thinking inline gets it split from the `<think>` block; `text` keeps what
    the server returned as content so grading sees the same answer the server gave."""
    u = _usage_fields(usage)
    if not reasoning:
        reasoning = split_thinking(content)[0]
    thinking = u["reasoning_tokens"]
    if thinking is None and u["completion_tokens"] is not None and not reasoning:
        thinking = 0  # nothing was reasoned, so every completion token is answer
    answer = u["completion_tokens"] - thinking if u["completion_tokens"] is not None and thinking is not None else None
    return Completion(text=content, reasoning=reasoning, tool_calls=tool_calls, prompt_tokens=u["prompt_tokens"],
                      cached_prompt_tokens=u["cached_prompt_tokens"], completion_tokens=u["completion_tokens"],
                      thinking_tokens=thinking, answer_tokens=answer, latency_s=latency, finish_reason=finish_reason,
                      ttft_s=ttft)


def _call_dict(call: Any) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments}}


def merge_tool_call_deltas(calls: dict[int, dict[str, Any]], deltas: list[Any]) -> None:
    """Streamed tool calls arrive in pieces keyed by index: id and name once, arguments in fragments."""
    for d in deltas:
        call = calls.setdefault(d.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if d.id:
            call["id"] = d.id
        if d.function is not None:
            call["function"]["name"] += d.function.name or ""
            call["function"]["arguments"] += d.function.arguments or ""


def describe_error(exc: Exception) -> str:
    import openai

    if isinstance(exc, openai.APIStatusError):
        body = exc.body if exc.body is not None else exc.response.text
        return f"http {exc.status_code}: {body}"
    return f"{type(exc).__name__}: {exc}"


class RedirectRefused(Exception):
    """A server's redirect to another origin, refused (backend.allow_cross_host_redirects=false)."""


async def refuse_cross_host_redirect(response: Any) -> None:
    """httpx response hook: the openai client follows redirects, so a redirect to another scheme,
    host or port is stopped here, before the request (the prompts) is sent there."""
    if not response.has_redirect_location:
        return
    here = response.request.url
    there = here.join(response.headers["location"])
    if (there.scheme, there.host, there.port) != (here.scheme, here.host, here.port):
        raise RedirectRefused(f"http {response.status_code}: the server redirects to another host "
                              f"({there.scheme}://{there.host}{':' + str(there.port) if there.port else ''}); refused "
                              "(backend.allow_cross_host_redirects=true to follow it)")


def parse_response(resp: Any, latency: float, clean: Callable[[str], str] = str) -> Completion:
    """A non-streamed response as a Completion; ValueError when the server's 200 is not a chat
    completion (an HTML page, `message: null`, usage as strings), so only this sample fails. Its
    body is quoted `clean`ed (redacted) first, then cut: a cut first would leave part of a key."""
    choices = _get(resp, "choices") if not isinstance(resp, (str, bytes)) else None
    if not isinstance(choices, list):
        raise ValueError(f"response is not a chat completion: {clean(str(resp))[:200]!r}")
    if not choices:
        raise ValueError("response has no choices")
    choice = choices[0]
    msg = _get(choice, "message")
    if msg is None:
        raise ValueError("response choice has no message")
    content = _get(msg, "content")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"message.content must be a string, got {type(content).__name__}")
    reasoning = _get(msg, "reasoning_content") or _get(msg, "reasoning") or ""
    if not isinstance(reasoning, str):
        raise ValueError(f"message reasoning must be a string, got {type(reasoning).__name__}")
    return to_completion(content or "", reasoning, [_call_dict(c) for c in _get(msg, "tool_calls") or []],
                         _get(resp, "usage"), _get(choice, "finish_reason"), latency, None)


class OpenAIBackend(Backend):
    config_class = OpenAIBackendConfig
    name = "openai"

    def __init__(self, model_cfg: ModelConfig, cfg: OpenAIBackendConfig, transport_factory: Any = None):
        self.cfg, self.model_cfg = cfg, model_cfg
        self.model = cfg.served_model or model_cfg.path or model_cfg.name
        # models the server said it answered with, other than the one asked: counted for the manifest
        self.reported_models: Counter[str] = Counter()
        # tests hand in an httpx transport factory to script the server's answers (429s, 400s)
        self.transport_factory = transport_factory
        # the HTTP client logs every request at INFO, which would bury the run's own log
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)

    def describe(self) -> dict[str, Any]:
        return {"base_url": self.cfg.base_url, "served_model": self.model, "extra_body": self.cfg.extra_body, "stream": self.cfg.stream,
                "concurrency": self.cfg.concurrency, "other_models_reported": dict(self.reported_models)}

    def _reported(self, model: Any) -> None:
        """The `model` a response names: another than the one asked (a dated variant of it, such as
        gpt-4.1-2025-04-14, is the same) is counted and warned about once."""
        if not isinstance(model, str) or model.startswith(self.model):
            return
        model = self.clean(model)
        if model not in self.reported_models:
            log.warning("the server answered as model %r, not %r as asked; counted in manifest.json "
                        "(model.other_models_reported)", model, self.model)
        self.reported_models[model] += 1

    def _client(self) -> Any:
        import httpx2
        import openai

        # imported here, like the client it wraps: the backend registry loads without the HTTP stack
        from harness.backends.capped_http import CappedTransport

        # local servers ignore the key, but the client insists on one
        key = os.environ.get(self.cfg.api_key_env) if self.cfg.api_key_env else "unused"
        inner = self.transport_factory() if self.transport_factory else httpx2.AsyncHTTPTransport()
        http = openai.DefaultAsyncHttpxClient(transport=CappedTransport(inner, self.cfg.max_response_bytes))
        if not self.cfg.allow_cross_host_redirects:
            http.event_hooks["response"] = [*http.event_hooks["response"], refuse_cross_host_redirect]
        return openai.AsyncOpenAI(base_url=self.cfg.base_url, api_key=key, max_retries=self.cfg.max_retries,
                                  timeout=self.cfg.timeout_s, http_client=http)

    def generate(self, requests: list[Request]) -> list[Completion]:
        return asyncio.run(self._generate(requests))

    async def _generate(self, requests: list[Request]) -> list[Completion]:
        gate = asyncio.Semaphore(self.cfg.concurrency)
        out: list[Completion] = [Completion()] * len(requests)
        t0 = time.perf_counter()
        async with self._client() as client:
            async def one(i: int) -> None:
                async with gate:
                    out[i] = await self._one(client, requests[i])

            # sent in prefix order, so a server's prefix cache sees requests sharing a prefix together
            await asyncio.gather(*(one(i) for i in prefix_order([prefix_key(r) for r in requests])))
        batch = time.perf_counter() - t0
        for c in out:  # latency_s stays each request's own time
            c.batch_latency_s = batch
        return out

    async def _one(self, client: Any, req: Request) -> Completion:
        import openai

        kwargs = request_kwargs(self.model, req, self.model_cfg.chat_template_kwargs, self.cfg.extra_body, self.cfg.stream,
                                hermes=self.model_cfg.tool_format == "hermes")
        t0 = time.perf_counter()
        try:
            # timeout_s bounds each read; a body trickling in a byte at a time needs an overall deadline
            return self.cleaned(await asyncio.wait_for(self._call(client, kwargs, t0), self.deadline_s))
        except openai.APIError as exc:
            error = describe_error(exc)
        except asyncio.TimeoutError:
            error = f"no complete response within the deadline of {self.deadline_s:g} s (backend.timeout_s x (max_retries + 1))"
        except Exception as exc:  # a dropped connection, a 200 that is not a chat completion: this sample's outcome
            error = f"{type(exc).__name__}: {exc}"
        return Completion(error=f"openai: {self.clean(error)}", latency_s=time.perf_counter() - t0)

    async def _call(self, client: Any, kwargs: dict[str, Any], t0: float) -> Completion:
        if self.cfg.stream:
            return await self._stream(client, kwargs, t0)
        resp = await client.chat.completions.create(**kwargs)
        self._reported(_get(resp, "model"))
        return parse_response(resp, time.perf_counter() - t0, self.clean)

    @property
    def deadline_s(self) -> float:
        return self.cfg.timeout_s * (self.cfg.max_retries + 1)

    def clean(self, text: str) -> str:
        """A text the server returned, as it may be stored: servers may echo the key (a 401 repeating
        the Authorization header, an answer quoting it), never store it; lone surrogates replaced."""
        return redact(whole_chars(text), os.environ.get(self.cfg.api_key_env) if self.cfg.api_key_env else None)

    def cleaned(self, c: Completion) -> Completion:
        """`c` with every text the server returned `clean`ed."""
        return replace(c, text=self.clean(c.text), reasoning=self.clean(c.reasoning),
                       tool_calls=map_strings(c.tool_calls, self.clean),
                       finish_reason=map_strings(c.finish_reason, self.clean),
                       error=map_strings(c.error, self.clean))

    async def _stream(self, client: Any, kwargs: dict[str, Any], t0: float) -> Completion:
        content, reasoning, calls = [], [], {}
        usage, finish, ttft = None, None, None
        stream = await client.chat.completions.create(**kwargs)
        chunks = 0
        async for chunk in stream:
            chunks += 1
            if chunks == 1:
                self._reported(_get(chunk, "model"))
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
        if not chunks:  # e.g. a 200 HTML page: no event at all is not an empty answer
            raise ValueError("the stream carried no chat completion chunks")
        if finish is None:  # the server closed the stream mid-answer: what arrived is not the model's answer
            return Completion(text="".join(content), error=f"openai: stream ended without a finish reason after "
                              f"{len(''.join(content))} characters (connection closed mid-answer?)",
                              latency_s=time.perf_counter() - t0, ttft_s=ttft)
        return to_completion("".join(content), "".join(reasoning), [calls[i] for i in sorted(calls)], usage, finish,
                             time.perf_counter() - t0, ttft)
