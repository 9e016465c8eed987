"""A scenario family: its config schema, its episode builder and what its episodes decide,
registered under its name (`harness.registry.FAMILIES`); the grid and id helpers every family shares.

A family declares its `Decision`: the kind of choice its episodes test (a call limit, a commit, a
verdict, a fact recalled...), the rule that labels a completion (`classify`, run by
`harness.measure.grading.grade_with`), and the candidate next actions `probe.propensity` scores, or
why the kind has none (a verdict or a fact stated in free text has no one continuation that stands
for the wrong answer). Only a call limit puts a `Rule` and a target on its episodes.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any, Callable

from harness.measure.grading import Classifier, Grade, classify_call_limit, grade_with
from harness.measure.propensity import Candidate, CandidateFn, call_limit_candidates
from harness.registry import FAMILIES
from harness.types import Completion, Episode, short_hash


@dataclass(frozen=True)
class Decision:
    kind: str  # call_limit, commit, repeat_call, verdict, fact, todo_step
    classify: Classifier  # (episode, answer, parsed calls) -> (label, reason)
    candidates: CandidateFn | None = None  # from the episode alone (never the condition)
    no_candidates: str = ""  # why this kind scores no propensity (recorded when probe.propensity is on)

    def __post_init__(self) -> None:
        if (self.candidates is None) == (not self.no_candidates):
            raise ValueError(f"decision {self.kind!r}: give candidates, or the reason it has none, not both")


CALL_LIMIT = Decision("call_limit", classify_call_limit, call_limit_candidates)


@dataclass(frozen=True)
class Family:
    name: str
    config_class: type
    build: Callable[[Any], list[Episode]]  # typed scenario config -> episodes, deterministic
    decides: Decision

    def grade(self, episode: Episode, completion: Completion) -> Grade:
        return grade_with(self.decides.classify, episode, completion)


def register(name: str, config_class: type, decides: Decision):
    def deco(build: Callable[[Any], list[Episode]]):
        FAMILIES.add(name, Family(name, config_class, build, decides))
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


def grade(episode: Episode, completion: Completion) -> Grade:
    """Grade with the episode's family's rule."""
    return FAMILIES.get(episode.family).grade(episode, completion)


def candidates(episode: Episode) -> list[Candidate] | None:
    """The episode's family's candidate next actions for probe.propensity; None when it has none."""
    fn = FAMILIES.get(episode.family).decides.candidates
    return fn(episode) if fn else None


def no_candidates(episode: Episode) -> str | None:
    """Why the episode's family scores no propensity; None when it has candidates."""
    return FAMILIES.get(episode.family).decides.no_candidates or None
