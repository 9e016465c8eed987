"""Expand a config into samples: episodes x conditions x replicates, each with a stable id."""
from __future__ import annotations

from dataclasses import dataclass, replace

import scenarios
from harness.config.schemas import ConditionConfig, Config, ModelConfig
from harness.context import view
from harness.types import Episode, Request, short_hash


@dataclass
class Sample:
    episode: Episode
    condition: str
    condition_cfg: ConditionConfig
    request: Request

    @property
    def sample_id(self) -> str:
        return self.request.sample_id


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


def make_plan(cfg: Config) -> list[Sample]:
    episodes = scenarios.build_episodes(cfg.scenario)
    cfg.check_plan_size(len(episodes))
    conditions = {name: with_model(ccfg, cfg.model) for name, ccfg in cfg.conditions.items()}
    gen = cfg.model.generation
    identity = {"model": cfg.model.identity(), "backend": cfg.backend.identity(), "generation": gen.identity()}
    samples: list[Sample] = []
    for episode in episodes:
        candidates = scenarios.candidates(episode) if cfg.probe.propensity else None
        no_candidates = scenarios.no_candidates(episode) if cfg.probe.propensity else None
        for name, ccfg in conditions.items():
            shown = view(episode, ccfg)
            for replicate in range(cfg.experiment.replicates):
                seed = sample_seed(cfg.experiment.seed, episode.id, replicate)
                sid = short_hash({"episode": episode.id, "condition": {"name": name, **ccfg.identity()},
                                  "replicate": replicate, "seed": seed, **identity})
                request = Request(sample_id=sid, episode_id=episode.id, condition=name, replicate=replicate,
                                  index=len(samples), messages=shown.messages, tools=episode.tools, generation=gen, seed=seed,
                                  candidates=candidates, no_candidates=no_candidates, annotations=shown.annotations())
                samples.append(Sample(episode, name, ccfg, request))
    shard = cfg.run.shard_spec
    # filtered after numbering: `index` stays the position in the whole plan
    return samples if shard is None else [s for s in samples if in_shard(s.request.episode_id, *shard)]


def in_shard(episode_id: str, i: int, n: int) -> bool:
    """Whole episodes go to one shard (arms and replicates stay together), spread by a stable hash."""
    return int(short_hash({"shard_of": episode_id}, 8), 16) % n == i

