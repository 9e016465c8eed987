"""Backends: one class each, one batch method `generate(requests) -> completions` (same order).

Per-sample failures come back as a Completion with `error` set, never as an exception. Heavy
libraries are imported inside the backend module that needs them.
"""
from __future__ import annotations

from typing import Any, Protocol

from harness.config import Config
from harness.types import Completion, Request


class Backend(Protocol):
    name: str

    def generate(self, requests: list[Request]) -> list[Completion]: ...

    def describe(self) -> dict[str, Any]: ...


def make_backend(cfg: Config) -> Backend:
    name = cfg.backend.name
    if name == "hf":
        from .hf import HFBackend

        return HFBackend(cfg.model, cfg.backend)
    if name == "scripted":
        from .scripted import ScriptedBackend

        return ScriptedBackend(cfg.backend, cfg.model)
    if name == "openai":
        from .openai_api import OpenAIBackend

        return OpenAIBackend(cfg.model, cfg.backend)
    if name == "vllm":
        from .vllm import VLLMBackend

        return VLLMBackend(cfg.model, cfg.backend)
    raise ValueError(f"backend.name: unknown backend {name!r}")
