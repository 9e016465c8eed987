"""Backends: one module each, holding its config class and a class with one batch method
`generate(requests) -> completions` (same order) that names its config class (`config_class`),
named in `harness.registry.BACKENDS` by a lazy "module:Class" entry (a lookup imports that module only).

Per-sample failures come back as a Completion with `error` set, never as an exception. Backend
modules import their heavy libraries (torch, vllm, openai) inside methods, so importing this
package (which imports every backend module to fill the registry) stays fast.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.config.schemas import BackendConfig, ModelConfig
from harness.registry import BACKENDS
from harness.types import Completion, Request


class Backend:
    """What every backend is: one batch method, a description for the manifest, and capabilities as
    methods it overrides where it has them. Used as a context manager: the engine is closed on exit."""
    name: str
    config_class: type[BackendConfig]  # its config schema (backend=NAME composes onto it)

    def generate(self, requests: list[Request]) -> list[Completion]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {}

    def attach(self, job_dir: Path) -> None:
        """Called once the run is open, with the directory the job writes (a backend that keeps state
        there, such as the batch ids of backend.batch=true, remembers it)."""

    def hf_weights(self) -> Any:
        """The backend itself where it holds HF weights and a tokenizer that the attention probe
        replays with (`model`, `tokenizer`, `render`, `decoder`); None where it holds none."""
        return None

    def scores_candidates(self) -> bool:
        """Whether generate fills each completion's `propensity` from the request's candidates."""
        return False

    def reset_prefix_cache(self) -> None:
        """Forget the prompts an engine keeps computed across calls (a benchmark's timed runs start cold)."""

    def close(self) -> None:
        """Release engines, worker processes and connections (idempotent)."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def make_backend(model: ModelConfig, backend: BackendConfig) -> Backend:
    return BACKENDS.get(backend.name, "backend.name")(model, backend)
