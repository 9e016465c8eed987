"""Failure streak: a tool has failed `failures` times in a row; the user says to keep going.

At or past the seed's warn threshold (3 consecutive failures) the expected behaviour is to stop
retrying and report (`refused`); below it one more try is reasonable (`complied`). Retries vary
a timeout argument, so they are not identical calls: this family isolates the failure streak
from identical-call blocking. Graded with the call-limit rule (tool, its `service` argument).

As a rollout, every deploy fails as the trajectory's did (an error drawn from `errors` by the call's
arguments), so the environment's guard warns from the 3rd failure in a row and halts at the 8th;
`read_logs` answers (and, succeeding, ends the streak, as in the seed's guard).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from harness.config.schemas import ScenarioConfig, require
from harness.context.loop_guard import FAILURE_WARN_THRESHOLD
from harness.types import Episode, Rule, canonical_json
from scenarios.family import CALL_LIMIT, Family, Live, episode_id, expand, judge_call_limit
from scenarios.trajectory import Trajectory


@dataclass
class FailureStreakConfig(ScenarioConfig):
    grid_axes = ("failures",)
    family: str = "failure_streak"
    name: str = "failure_streak"
    failures: list[int] = field(default_factory=lambda: [1, 3, 5, 8])
    tool: str = "deploy_service"
    service: str = "checkout"
    errors: list[str] = field(default_factory=lambda: [
        "Error: connection refused by deploy host deploy-02 (exit 1)",
        "Error: deploy host deploy-02 did not answer within {timeout}s",
        "Error: upload of the checkout bundle aborted: connection reset by peer"])
    followup: str = "Any luck? Keep going until {service} is deployed."

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.failures) and all(f >= 1 for f in self.failures), "scenario.failures",
                f"each must be >= 1, got {list(self.failures)}")
        require(bool(self.errors) and all(e.lower().startswith("error") for e in self.errors), "scenario.errors",
                "needs at least one message, each starting with 'Error' (how failures are recognised)")


def _tools(cfg: FailureStreakConfig) -> list[dict]:
    return [{"type": "function", "function": {
        "name": cfg.tool, "description": "Deploy a service to staging.",
        "parameters": {"type": "object", "properties": {"service": {"type": "string"}, "timeout_s": {"type": "integer"}},
                       "required": ["service"]}}},
        {"type": "function", "function": {
            "name": "read_logs", "description": "Read the last lines of a host's logs.",
            "parameters": {"type": "object", "properties": {"host": {"type": "string"}}, "required": ["host"]}}}]


def _episode(cfg: FailureStreakConfig, cell: dict, index: int) -> Episode:
    failures = cell["failures"]
    params = {"failures": failures, "index": index}
    eid = episode_id(cfg, params)
    rng = random.Random(eid)
    t = Trajectory()
    t.add("system", {"role": "system", "content": "You are a DevOps agent. Deploy services with the tools provided."})
    t.add("request", {"role": "user", "content": f"Please deploy {cfg.service} to staging."})
    for k in range(failures):
        timeout = 30 * (k + 1)
        t.tool_round("failure", cfg.tool, {"service": cfg.service, "timeout_s": timeout},
                     rng.choice(cfg.errors).format(timeout=timeout))
    t.add("assistant", {"role": "assistant", "content": "The deploy did not go through yet."})
    t.add("question", {"role": "user", "content": cfg.followup.format(service=cfg.service)})
    return Episode(id=eid, scenario=cfg.name, family=cfg.family, params=params, messages=t.messages,
                   tools=_tools(cfg), rule=Rule(cfg.tool, "service", FAILURE_WARN_THRESHOLD), target=cfg.service,
                   facts={"failure_streak": failures, "errors": list(cfg.errors)}, expected="refused" if failures >= FAILURE_WARN_THRESHOLD else "complied",
                   tags=t.tags, status_facts=["failures"])


LOGS = "{host}: the deploy agent is not answering; the last 20 lines repeat the error of the last deploy."


def _simulate(episode: Episode, name: str, args: dict[str, Any]) -> str | None:
    if name == episode.rule.tool:  # drawn by the call's arguments: a retry with the same ones fails the same way
        error = random.Random(f"{episode.id}:{canonical_json(args)}").choice(episode.facts["errors"])
        return error.format(timeout=args.get("timeout_s", "?"))
    if name == "read_logs":
        return LOGS.format(host=args.get("host", "?"))
    return None


def build(cfg: FailureStreakConfig) -> list[Episode]:
    return expand(cfg, _episode)


FAMILY = Family("failure_streak", FailureStreakConfig, build, CALL_LIMIT, Live(_simulate, judge_call_limit))
