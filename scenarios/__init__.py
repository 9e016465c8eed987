"""Scenario families. A family is one module here that calls `register`; importing the package
registers all of them. A variant of a family is a YAML file under conf/scenario/."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from harness.types import Completion, Episode

Grader = Callable[[Episode, Completion], tuple]  # -> (label, correct, parsed calls), see harness.grading


@dataclass(frozen=True)
class Family:
    name: str
    config_class: type
    build: Callable[[Any], list[Episode]]  # typed scenario config -> episodes, deterministic
    grade: Grader  # each family labels completions by its own rule (harness.grading has the helpers)


FAMILIES: dict[str, Family] = {}


def register(name: str, config_class: type, grade: Grader):
    def deco(build: Callable[[Any], list[Episode]]):
        FAMILIES[name] = Family(name, config_class, build, grade)
        return build

    return deco


def build_episodes(scenario_cfg: Any) -> list[Episode]:
    family = FAMILIES.get(scenario_cfg.family)
    if family is None:
        raise ValueError(f"scenario.family: unknown family {scenario_cfg.family!r}; known: {sorted(FAMILIES)}")
    return family.build(scenario_cfg)


def grade(episode: Episode, completion: Completion) -> tuple:
    """Grade with the episode's family's grader."""
    return FAMILIES[episode.family].grade(episode, completion)


for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")
