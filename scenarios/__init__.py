"""Scenario families. A family is one module here defining its `FAMILY` (scenarios.family.Family), named in
harness.registry.FAMILIES; a lookup imports that module only. A variant of a family is a YAML file under conf/scenario/."""
from scenarios.family import build_episodes, candidates, grade, live, no_candidates

__all__ = ["build_episodes", "candidates", "grade", "live", "no_candidates"]
