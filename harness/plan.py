"""Expand a config into samples: episodes x conditions x replicates, each with a stable id."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import scenarios
from harness.config import ConditionConfig, Config
from harness.context import apply
from harness.types import Episode, GenerationSettings, Request, sha256, short_hash


@dataclass
class Sample:
    episode: Episode
    condition: str
    condition_cfg: ConditionConfig
    request: Request

    @property
    def sample_id(self) -> str:
        return self.request.sample_id


def model_identity(cfg: Config) -> dict[str, Any]:
    m = cfg.model
    return {"name": m.name, "path": m.path, "revision": m.revision, "gguf_package": m.gguf_package, "gguf_file": m.gguf_file,
            "chat_template_kwargs": dict(m.chat_template_kwargs), "tool_format": m.tool_format}


def backend_identity(cfg: Config) -> dict[str, Any]:
    # what changes outputs, not where they run: dtype does, device and batch size do not
    identity = {"name": cfg.backend.name, "dtype": getattr(cfg.backend, "dtype", None)}
    if cfg.backend.name == "scripted":  # another completions file is another set of outputs
        identity["completions_sha256"] = sha256(Path(cfg.backend.path).expanduser().read_text(encoding="utf-8"))
    return identity


def condition_identity(ccfg: ConditionConfig) -> dict[str, Any]:
    """kind, format and every field set away from its default: a condition field added later, at
    its default, keeps the sample ids of runs made before it (they resume instead of rerunning)."""
    default = asdict(ConditionConfig())
    return {k: v for k, v in asdict(ccfg).items() if k in ("kind", "format") or v != default[k]}


def sample_seed(base_seed: int, episode_id: str, replicate: int) -> int:
    # shared by the conditions of one episode and replicate: paired arms see the same random stream
    return int(short_hash({"seed": base_seed, "episode": episode_id, "replicate": replicate}, 8), 16)


def make_plan(cfg: Config) -> list[Sample]:
    episodes = scenarios.build_episodes(cfg.scenario)
    cfg.check_plan_size(len(episodes))
    gen = GenerationSettings(**asdict(cfg.model.generation))
    identity = {"model": model_identity(cfg), "backend": backend_identity(cfg), "generation": asdict(gen)}
    samples: list[Sample] = []
    for episode in episodes:
        for name, ccfg in cfg.conditions.items():
            messages = apply(episode, ccfg)
            for replicate in range(cfg.experiment.replicates):
                seed = sample_seed(cfg.experiment.seed, episode.id, replicate)
                sid = short_hash({"episode": episode.id, "condition": {"name": name, **condition_identity(ccfg)},
                                  "replicate": replicate, "seed": seed, **identity})
                request = Request(sample_id=sid, episode_id=episode.id, condition=name, replicate=replicate,
                                  index=len(samples), messages=messages, tools=episode.tools, generation=gen, seed=seed)
                samples.append(Sample(episode, name, ccfg, request))
    shard = cfg.run.shard_spec
    # filtered after numbering: `index` stays the position in the whole plan
    return samples if shard is None else [s for s in samples if in_shard(s.request.episode_id, *shard)]


SHARDS_DIR = "shards"


def in_shard(episode_id: str, i: int, n: int) -> bool:
    """Whole episodes go to one shard (arms and replicates stay together), spread by a stable hash."""
    return int(short_hash({"shard_of": episode_id}, 8), 16) % n == i


def shard_dir(run_dir: Path, shard: tuple[int, int] | None) -> Path:
    """Where a job writes: the run directory itself, or its own subdirectory (its own writer lock)."""
    return run_dir if shard is None else run_dir / SHARDS_DIR / f"{shard[0]}-of-{shard[1]}"


def run_parts(run_dir: Path) -> list[Path]:
    """The directories holding a run's records: the run itself and/or each of its shards."""
    run_dir = Path(run_dir)
    shards = sorted(p.parent for p in run_dir.glob(f"{SHARDS_DIR}/*/records.jsonl"))
    return [run_dir] + shards if (run_dir / "records.jsonl").exists() or not shards else shards
