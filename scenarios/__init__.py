"""Scenario families. A family is one module here that calls `register`; importing the package
registers all of them. A variant of a family is a YAML file under conf/scenario/."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from harness.types import Episode


@dataclass(frozen=True)
class Family:
    name: str
    config_class: type
    build: Callable[[Any], list[Episode]]  # typed scenario config -> episodes, deterministic


FAMILIES: dict[str, Family] = {}


def register(name: str, config_class: type):
    def deco(build: Callable[[Any], list[Episode]]):
        FAMILIES[name] = Family(name, config_class, build)
        return build

    return deco


def build_episodes(scenario_cfg: Any) -> list[Episode]:
    family = FAMILIES.get(scenario_cfg.family)
    if family is None:
        raise ValueError(f"scenario.family: unknown family {scenario_cfg.family!r}; known: {sorted(FAMILIES)}")
    return family.build(scenario_cfg)


for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")
