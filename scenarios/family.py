"""A scenario family: its config schema, its episode builder, its grader and its propensity
candidates, registered under its name (`harness.registry.FAMILIES`); the grid and id helpers every family shares."""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any, Callable

from harness.measure.propensity import Candidate, CandidateFn, call_limit_candidates
from harness.registry import FAMILIES
from harness.types import Completion, Episode, short_hash

Grader = Callable[[Episode, Completion], tuple]  # -> (label, correct, parsed calls), see harness.measure.grading


@dataclass(frozen=True)
class Family:
    name: str
    config_class: type
    build: Callable[[Any], list[Episode]]  # typed scenario config -> episodes, deterministic
    grade: Grader  # each family labels completions by its own rule (harness.measure.grading has the helpers)
    # the candidate next actions probe.propensity scores, from the episode alone (never the condition);
    # None: the family defines none
    candidates: CandidateFn | None = call_limit_candidates


def register(name: str, config_class: type, grade: Grader, candidates: CandidateFn | None = call_limit_candidates):
    def deco(build: Callable[[Any], list[Episode]]):
        FAMILIES.add(name, Family(name, config_class, build, grade, candidates))
        return build

    return deco


def expand(cfg: Any, make: Callable[[Any, dict[str, Any], int], Episode]) -> list[Episode]:
    """A family's grid: every combination of the values of its config's list-valued `grid_axes` (first
    axis outermost), `episodes_per_cell` episodes each, made by `make(cfg, cell, index)`."""
    axes = cfg.grid_axes
    cells = [dict(zip(axes, values)) for values in itertools.product(*(getattr(cfg, a) for a in axes))]
    return [make(cfg, cell, i) for cell in cells for i in range(cfg.episodes_per_cell)]


def episode_id(cfg: Any, params: dict[str, Any]) -> str:
    """A stable episode id: the scenario's name, the episode's parameters and every other config field
    (its texts included), so editing a scenario's prompt text makes new episodes."""
    return short_hash({"scenario": cfg.name, "params": params,
                       "config": {k: v for k, v in asdict(cfg).items() if k not in cfg.grid_axes}})


def build_episodes(scenario_cfg: Any) -> list[Episode]:
    return FAMILIES.get(scenario_cfg.family, "scenario.family").build(scenario_cfg)


def grade(episode: Episode, completion: Completion) -> tuple:
    """Grade with the episode's family's grader."""
    return FAMILIES.get(episode.family).grade(episode, completion)


def candidates(episode: Episode) -> list[Candidate] | None:
    """The episode's family's candidate next actions for probe.propensity; None when it defines none."""
    fn = FAMILIES.get(episode.family).candidates
    return fn(episode) if fn else None

