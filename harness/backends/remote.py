"""What the API backends (openai, anthropic) share: the transport settings, the key's handling, and the
loop that sends a batch of requests concurrently and turns every failure into that sample's error record.

The API key is read from the environment variable named by backend.api_key_env, lives only inside the
client object, and is redacted (harness.io.secrets) from every text a server returns: content,
reasoning, tool calls, finish reason and error bodies, before anything stores or prints them. Lone
surrogates in those texts become U+FFFD (harness.io.text), as do bytes that are not UTF-8
(harness.backends.capped_http). Retries with exponential backoff and jitter (408/409/429/5xx, the
Anthropic API's 529 overloaded among them, timeouts and dropped connections) are the SDK clients' own
(backend.max_retries); a request past its overall deadline (timeout_s x (max_retries + 1)) is an error
record. With backend.batch=true the requests go to the provider's batch API instead
(harness.backends.batch).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Optional

from harness.backends import Backend
from harness.backends.batch import run_batch
from harness.backends.sdk_errors import describe_error
from harness.config.schemas import BackendConfig, ModelConfig, require
from harness.engine.prefix import prefix_key, prefix_order
from harness.io.secrets import looks_like_secret, redact
from harness.io.text import map_strings, whole_chars
from harness.io.validate import token_count
from harness.types import Completion, Request

log = logging.getLogger(__name__)


@dataclass
class RemoteBackendConfig(BackendConfig):
    """Settings every API backend has; each backend's config class sets its own defaults."""

    base_url: str = "http://127.0.0.1:8000/v1"
    served_model: Optional[str] = None  # the server's model name; null = model.path, else model.name
    # name of the environment variable holding the key; the key itself never enters the config
    api_key_env: Optional[str] = "OPENAI_API_KEY"
    concurrency: int = 8  # requests in flight at once
    max_retries: int = 5  # the client's own exponential backoff with jitter on 408/409/429/5xx/timeouts
    timeout_s: float = 300.0
    stream: bool = False  # on: time to first token is measured
    # a response's decoded body (a stream's included) past this many bytes is an error record, not read on:
    # memory stays bounded against a gzip bomb; 32 MB holds a streamed answer of ~100k tokens
    max_response_bytes: int = 32_000_000
    extra_body: dict[str, Any] = field(default_factory=dict)  # provider-specific request fields
    # a 3xx to another scheme, host or port would send the prompts there: refused unless set
    allow_cross_host_redirects: bool = False
    # frozen episodes through the provider's batch API (about half the price, answers within 24 h): each
    # backend call is one provider batch, its id stored in the run directory (harness.backends.batch)
    batch: bool = False
    poll_s: float = 30.0  # seconds between two looks at a submitted batch
    # transport only: base_url, served_model and extra_body decide the outputs and are identity
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"api_key_env", "concurrency", "max_retries", "timeout_s", "stream",
                                                     "max_response_bytes", "allow_cross_host_redirects", "batch", "poll_s"})

    def __post_init__(self) -> None:
        require(self.base_url.startswith(("http://", "https://")), "backend.base_url", f"must be an http(s) URL, got {self.base_url!r}")
        require(self.concurrency >= 1, "backend.concurrency", f"must be >= 1, got {self.concurrency}")
        require(self.max_retries >= 0, "backend.max_retries", f"must be >= 0, got {self.max_retries}")
        require(self.timeout_s > 0, "backend.timeout_s", f"must be > 0, got {self.timeout_s}")
        require(self.max_response_bytes >= 1, "backend.max_response_bytes", f"must be >= 1, got {self.max_response_bytes}")
        require(self.poll_s > 0, "backend.poll_s", f"must be > 0, got {self.poll_s}")
        require(not (self.api_key_env and looks_like_secret(self.api_key_env)), "backend.api_key_env",  # the value is not repeated
                "must be the NAME of the environment variable holding the key; the value looks like a key itself")

    def takes_thinking_settings(self) -> bool:
        return True

    def check_machine(self) -> None:
        if self.api_key_env:
            require(bool(os.environ.get(self.api_key_env)), "backend.api_key_env",
                    f"environment variable {self.api_key_env} is not set (or set backend.api_key_env=null for a server without keys)")


def usage_counts(fields: dict[str, Any], parts: tuple[tuple[str, str, str], ...] = ()) -> dict[str, int | None]:
    """Token counts of a response's usage. The client does not validate what the server sent: when
    one is not a count (a string, a bool, a float, negative) or they contradict each other (a part
    larger than its whole, e.g. more cached than prompt tokens: `parts` as (part, whole, name)), every
    count of the sample is unknown (None), never a wrong number; the answer itself is kept."""
    counts, bad = {}, []
    for k, v in fields.items():
        try:
            counts[k] = token_count(v, k)
        except ValueError:
            bad.append(f"usage.{k} is not a token count")  # the value is not logged: it is the server's text
    for part, whole, name in parts:
        if None not in (counts.get(part), counts.get(whole)) and counts[part] > counts[whole]:
            bad.append(f"{counts[part]} {name} tokens exceed the {counts[whole]} {whole.replace('_', ' ')}")
    if bad:
        log.warning("a response's usage is invalid (%s): this sample's token counts are unknown", "; ".join(bad))
        return dict.fromkeys(fields)
    return counts


class RedirectRefused(Exception):
    """A server's redirect to another origin, refused (backend.allow_cross_host_redirects=false)."""


async def refuse_cross_host_redirect(response: Any) -> None:
    """httpx response hook: the clients follow redirects, so a redirect to another scheme, host or
    port is stopped here, before the request (the prompts) is sent there."""
    if not response.has_redirect_location:
        return
    here = response.request.url
    there = here.join(response.headers["location"])
    if (there.scheme, there.host, there.port) != (here.scheme, here.host, here.port):
        raise RedirectRefused(f"http {response.status_code}: the server redirects to another host "
                              f"({there.scheme}://{there.host}{':' + str(there.port) if there.port else ''}); refused "
                              "(backend.allow_cross_host_redirects=true to follow it)")


class RemoteBackend(Backend):
    """An API backend: `_call` sends one request and shapes its answer; everything else is here."""

    # the message prefix of this backend's error records (the backend's name)
    label: str = "api"

    def __init__(self, model_cfg: ModelConfig, cfg: RemoteBackendConfig, transport_factory: Any = None):
        self.cfg, self.model_cfg = cfg, model_cfg
        self.model = cfg.served_model or model_cfg.path or model_cfg.name
        # models the server said it answered with, other than the one asked: counted for the manifest
        self.reported_models: Counter[str] = Counter()
        # tests hand in an httpx transport factory to script the server's answers (429s, 400s)
        self.transport_factory = transport_factory
        self.job_dir: Path | None = None  # batch mode keeps its submitted batches there (attach)
        # the HTTP client logs every request at INFO, which would bury the run's own log
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)

    def attach(self, job_dir: Path) -> None:
        self.job_dir = Path(job_dir)

    def describe(self) -> dict[str, Any]:
        return {"base_url": self.cfg.base_url, "served_model": self.model, "extra_body": self.cfg.extra_body, "stream": self.cfg.stream,
                "concurrency": self.cfg.concurrency, "batch": self.cfg.batch, "other_models_reported": dict(self.reported_models)}

    @property
    def key(self) -> str | None:
        return os.environ.get(self.cfg.api_key_env) if self.cfg.api_key_env else None

    def http_client(self, client_class: type, sdk_error: type[Exception]) -> Any:
        """The SDK's own httpx client class (its timeouts and limits) over the capped transport, with
        cross-host redirects refused."""
        import httpx2

        from harness.backends.capped_http import CappedTransport, refusal

        inner = self.transport_factory() if self.transport_factory else httpx2.AsyncHTTPTransport()
        http = client_class(transport=CappedTransport(inner, self.cfg.max_response_bytes, refusal(sdk_error)))
        if not self.cfg.allow_cross_host_redirects:
            http.event_hooks["response"] = [*http.event_hooks["response"], refuse_cross_host_redirect]
        return http

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

    @property
    def deadline_s(self) -> float:
        return self.cfg.timeout_s * (self.cfg.max_retries + 1)

    def clean(self, text: str) -> str:
        """A text the server returned, as it may be stored: servers may echo the key (a 401 repeating
        the Authorization header, an answer quoting it), never store it; lone surrogates replaced."""
        return redact(whole_chars(text), self.key)

    def cleaned(self, c: Completion) -> Completion:
        """`c` with every text the server returned `clean`ed."""
        return replace(c, text=self.clean(c.text), reasoning=self.clean(c.reasoning),
                       tool_calls=map_strings(c.tool_calls, self.clean),
                       finish_reason=map_strings(c.finish_reason, self.clean),
                       error=map_strings(c.error, self.clean), request_id=map_strings(c.request_id, self.clean))

    def failed(self, error: str, **fields: Any) -> Completion:
        """This sample's error record, the server's text in it cleaned."""
        return Completion(error=f"{self.label}: {self.clean(error)}", **fields)

    # --- what each API backend provides ---------------------------------------------------------

    def _client(self) -> Any:
        """The SDK's async client (a context manager)."""
        raise NotImplementedError

    async def _call(self, client: Any, req: Request, t0: float) -> Completion:
        """One request sent and its answer shaped; raises on any failure (the caller records it)."""
        raise NotImplementedError

    def _batch(self) -> Any:
        """The provider's batch API (harness.backends.batch.BatchApi) for backend.batch=true."""
        raise NotImplementedError

    # --- the loop ---------------------------------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[Completion]:
        if self.cfg.batch:
            return run_batch(self._batch(), requests, self.job_dir, self.cfg.poll_s, self.cleaned)
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
        t0 = time.perf_counter()
        try:
            # timeout_s bounds each read; a body trickling in a byte at a time needs an overall deadline
            return self.cleaned(await asyncio.wait_for(self._call(client, req, t0), self.deadline_s))
        except asyncio.TimeoutError:
            error = f"no complete response within the deadline of {self.deadline_s:g} s (backend.timeout_s x (max_retries + 1))"
        except Exception as exc:  # an HTTP error, a dropped connection, a 200 that is not an answer: this sample's outcome
            error = describe_error(exc)
        return self.failed(error, latency_s=time.perf_counter() - t0)
