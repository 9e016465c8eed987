"""Scenario families. A family is one module here that registers itself (`scenarios.family.register`);
the first lookup of a family imports them all. A variant of a family is a YAML file under conf/scenario/."""
from scenarios.family import build_episodes, candidates, grade, live, no_candidates

__all__ = ["build_episodes", "candidates", "grade", "live", "no_candidates"]
