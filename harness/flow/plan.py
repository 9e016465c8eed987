"""Expand an experiment into rollouts: episodes x conditions x replicates, each with a stable id and
its environment. A single decision on a frozen trajectory is a one-step rollout (`Frozen`); with
`rollout` set, each episode's trajectory opens a live environment the model acts in."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import scenarios
from harness.agent.env import Environment, Frozen
from harness.config.schemas import BackendConfig, ModelConfig, RolloutConfig, ScenarioConfig, plan_size_error
from harness.context import ConditionConfig
from harness.context.bar import check_cadence
from harness.context.history import History
from harness.context.loop_guard import LoopGuardConfig
from harness.errors import ConfigError, require
from harness.types import Episode, Record, short_hash


@dataclass(frozen=True)
class PlanSpec:
    """What decides which rollouts exist and how their prompts are built (the run's fingerprint is
    made of the same pieces)."""
    scenario: ScenarioConfig
    conditions: dict[str, ConditionConfig]
    model: ModelConfig
    backend: BackendConfig
    replicates: int
    seed: int
    rollout: RolloutConfig | None  # None: single decisions on frozen trajectories
    shard: tuple[int, int] | None = None
    propensity: bool = False
    max_samples: int = 200_000

    def identity(self) -> dict[str, Any]:
        """What every rollout id hashes besides its episode, condition and replicate."""
        out = {"model": self.model.identity(), "backend": self.backend.identity(),
               "generation": self.model.generation.identity()}
        if self.rollout is not None:  # only then: single decisions keep the ids they always had
            out["rollout"] = self.rollout.identity()
        return out


@dataclass
class Rollout:
    """One episode under one condition and replicate, and the environment it runs in."""
    rollout_id: str
    index: int  # position in the whole plan (before sharding): a scripted backend's match=order answers it
    episode: Episode
    condition: str
    condition_cfg: ConditionConfig
    replicate: int
    seed: int
    env: Environment | Frozen
    steps: list[Record] = field(default_factory=list)  # its records so far, until its rollout record is written

    @property
    def frozen(self) -> bool:
        return isinstance(self.env, Frozen)


def with_model(ccfg: ConditionConfig, model: ModelConfig) -> ConditionConfig:
    """The run's model and thinking tier for `<turn_meta>` (the reasoning effort where the template
    takes one, else thinking on/off). Set only where the block is shown: other conditions keep
    their sample ids."""
    if ccfg.turn_meta is None:
        return ccfg
    tier = model.chat_template_kwargs.get("reasoning_effort") or ("on" if model.thinking else "off")
    return replace(ccfg, turn_meta=replace(ccfg.turn_meta, model=model.name, thinking=str(tier)))


def sample_seed(base_seed: int, episode_id: str, replicate: int) -> int:
    # shared by the conditions of one episode and replicate: paired arms see the same random stream
    return int(short_hash({"seed": base_seed, "episode": episode_id, "replicate": replicate}, 8), 16)


def make_plan(spec: PlanSpec) -> list[Rollout]:
    if spec.rollout is not None:  # a step is labelled against the live history: only a family with a Live environment runs
        scenarios.live(spec.scenario.family)
    episodes = scenarios.build_episodes(spec.scenario)
    too_many = plan_size_error(len(episodes), len(spec.conditions), spec.replicates, spec.max_samples)
    require(too_many is None, "run.max_samples", too_many or "")
    if spec.rollout is not None and spec.rollout.compact_tokens is not None:
        require(all(e.compact_at is not None for e in episodes), "rollout.compact_tokens",
                f"the {spec.scenario.family} family has no compaction point (no summary to compact to)")
    conditions = {name: with_model(ccfg, spec.model) for name, ccfg in spec.conditions.items()}
    for name, ccfg in conditions.items():
        check_condition(name, ccfg, episodes, spec.rollout)
    identity = spec.identity()
    out: list[Rollout] = []
    for episode in episodes:
        for name, ccfg in conditions.items():
            for replicate in range(spec.replicates):
                seed = sample_seed(spec.seed, episode.id, replicate)
                rid = short_hash({"episode": episode.id, "condition": {"name": name, **ccfg.identity()},
                                  "replicate": replicate, "seed": seed, **identity})
                env = Frozen(episode) if spec.rollout is None else Environment(episode, spec.rollout, ccfg.loop_guard)
                out.append(Rollout(rid, len(out), episode, name, ccfg, replicate, seed, env))
    # filtered after numbering: `index` stays the position in the whole plan
    return out if spec.shard is None else [r for r in out if in_shard(r.episode.id, *spec.shard)]


def check_condition(name: str, ccfg: ConditionConfig, episodes: list[Episode], rollout: RolloutConfig | None) -> None:
    """A condition whose mechanism could show nothing on these episodes is refused (ConfigError naming
    it), never run as another arm under its label."""
    family = episodes[0].family if episodes else ""
    if ccfg.diagnostics and not any(e.facts.get("diagnostics") for e in episodes):
        raise ConfigError(f"conditions.{name}.diagnostics: the {family} family's episodes carry no edit diagnostics "
                          "to flush (the diagnostics family's do); this condition would show what `none` shows")
    if ccfg.history == History.compacted and not (rollout and rollout.compact_tokens) \
            and any(e.compact_at is None for e in episodes):
        raise ConfigError(f"conditions.{name}.history: compacted needs a compaction point, and the {family} family's "
                          "episodes have none" + (" (or set rollout.compact_tokens=N)" if rollout else ""))
    if rollout and ccfg.loop_guard == LoopGuardConfig():
        raise ConfigError(f"conditions.{name}.loop_guard: in a rollout the loop guard is the environment's and runs under "
                          "every condition at these thresholds already; this condition would be another's under its "
                          "label (set other thresholds, e.g. loop_guard.block_at=4, or leave it out)")
    if ccfg.status is not None and episodes and (why := check_cadence(ccfg.status, episodes[0])):
        raise ConfigError(f"conditions.{name}.status.cadence: {why}")


def in_shard(episode_id: str, i: int, n: int) -> bool:
    """Whole episodes go to one shard (arms and replicates stay together), spread by a stable hash."""
    return int(short_hash({"shard_of": episode_id}, 8), 16) % n == i
