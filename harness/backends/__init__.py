"""Backends: one module each, holding its config class and a class with one batch method
`generate(requests) -> completions` (same order), registered with `@register_backend` in `harness.registry.BACKENDS`
(the first lookup imports every module of this package).

Per-sample failures come back as a Completion with `error` set, never as an exception. Backend
modules import their heavy libraries (torch, vllm, openai) inside methods, so importing this
package (which imports every backend module to fill the registry) stays fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from harness.config.schemas import BackendConfig, Config
from harness.registry import BACKENDS
from harness.types import Completion, Request


class Backend(Protocol):
    name: str

    def generate(self, requests: list[Request]) -> list[Completion]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BackendSpec:
    name: str
    config_class: type[BackendConfig]
    make: Callable[[Config], Backend]  # the run's config -> a loaded backend


def register_backend(name: str, config_class: type[BackendConfig]) -> Callable[[type], type]:
    """Class decorator: the backend is built as `cls(cfg.model, cfg.backend)`."""
    def deco(cls: type) -> type:
        BACKENDS.add(name, BackendSpec(name, config_class, lambda cfg: cls(cfg.model, cfg.backend)))
        return cls

    return deco


def make_backend(cfg: Config) -> Backend:
    return BACKENDS.get(cfg.backend.name, "backend.name").make(cfg)


def hf_weights(backend: Any) -> Any:
    """The backend itself when it holds HF weights and a tokenizer that the attention probe and
    likelihood scoring can reuse (`model`, `tokenizer`, `render`), else None."""
    return backend if getattr(backend, "holds_hf_weights", False) else None

