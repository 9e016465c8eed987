"""Ledger: the answer needs a fact from a file the agent read early in a long session.

The agent read the staging config (which holds the port), then did `later_reads` more file reads
(other services' configs, each with its own port) and test runs; the history is compacted before
the last rounds. The user asks for the staging port. Condition none shows the raw history;
`compacted` only the summary and the recent rounds; `ledger` (kind=ledger) the same plus what the
injection ledger lets back in: the recalled memory items (`facts["recall"]`, none of which holds
the port) and the previews of the last 12 file reads, under the budget. With more than 11 later
reads the early read has left the 12 previews: the control where the ledger cannot help.

Labels: complied (names the right port first, or reads the config again: the previews' advice),
violated (names another port-sized number first, 4-5 digits), other (no such number, another tool, nothing, a malformed call).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from harness.config.schemas import ScenarioConfig, require
from harness.measure.grading import Label, ParsedCall, no_call
from harness.types import Episode
from scenarios.family import Decision, Family, episode_id, expand
from scenarios.trajectory import Trajectory

GRID_AXES = ("later_reads",)


@dataclass
class LedgerConfig(ScenarioConfig):
    grid_axes = GRID_AXES
    family: str = "ledger"
    name: str = "ledger"
    later_reads: list[int] = field(default_factory=lambda: [4, 14])
    recent_rounds: int = 2  # rounds after the compaction point, shown raw by every condition
    workspace: str = "/home/dev/platform"
    path: str = "deploy/staging/api.toml"
    services: list[str] = field(default_factory=lambda: [
        "billing", "search", "notifier", "gateway", "auth", "reports", "media", "scheduler", "inventory", "ledger",
        "metrics", "exports", "webhooks", "profiles", "catalog", "checkout"])
    recall: list[str] = field(default_factory=lambda: [
        "Staging deploys go through the deploy/staging directory; production needs a change ticket.",
        "The team prefers blue-green rollouts for the api service.",
        "Config files are TOML; keys are snake_case."])
    question: str = "Quick one: which port does the api service listen on in staging? Just the number."

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.later_reads) and all(0 <= n <= len(self.services) for n in self.later_reads),
                "scenario.later_reads", f"each must be between 0 and the {len(self.services)} services, got {list(self.later_reads)}")
        require(self.recent_rounds >= 1, "scenario.recent_rounds", f"must be >= 1, got {self.recent_rounds}")


def _tools() -> list[dict]:
    return [{"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}
        for name, desc, props in [("read_file", "Read a file of the workspace.", {"path": {"type": "string"}}),
                                  ("run_tests", "Run the test suite (optionally one path).", {"path": {"type": "string"}})]]


def _config(service: str, port: int, rng: random.Random) -> str:
    return (f"# {service} service, staging\n[server]\nhost = \"0.0.0.0\"\nport = {port}\n"
            f"workers = {rng.randint(2, 16)}\n\n[database]\nurl = \"postgres://{service}@db-staging:5432/{service}\"\n"
            f"pool_size = {rng.randint(5, 40)}\n\n[logging]\nlevel = \"info\"\n")


def _episode(cfg: LedgerConfig, cell: dict, index: int) -> Episode:
    params = {**cell, "index": index}
    eid = episode_id(cfg, params)
    rng = random.Random(eid)
    ports = rng.sample(range(8000, 9900), len(cfg.services) + 1)
    port = ports.pop()
    t = Trajectory()
    t.add("system", {"role": "system", "content": (
        f"You are a platform engineer's agent working in {cfg.workspace}. Use the tools provided.")})
    t.add("request", {"role": "user", "content": (
        "We're moving the api service's staging deploy to the new cluster. Go through its config and the "
        "neighbouring services' configs, and run the tests.")})
    t.tool_round("early_read", "read_file", {"path": cfg.path}, _config("api", port, rng))
    rounds = []
    for service, p in zip(rng.sample(list(cfg.services), cell["later_reads"]), ports):
        rounds.append(("read_file", {"path": f"deploy/staging/{service}.toml"}, _config(service, p, rng)))
    rounds += [("run_tests", {"path": "tests/"}, f"{rng.randint(40, 90)} passed, 0 failed in {rng.uniform(2, 9):.2f}s")
               for _ in range(cfg.recent_rounds)]
    for name, args, result in rounds:
        t.tool_round("work", name, args, result)
    compact_at = len(t.messages) - 2 * cfg.recent_rounds
    t.add("question", {"role": "user", "content": cfg.question})
    summary = ("Summary of the conversation so far: the user asked to move the api service's staging deploy to the "
               f"new cluster. The agent read the staging configs under {cfg.workspace}/deploy/staging and ran the tests.")
    return Episode(id=eid, scenario=cfg.name, family=cfg.family, params=params, messages=t.messages, tools=_tools(),
                   rule=None, target=None,
                   facts={"port": port, "path": cfg.path, "other_ports": ports[:cell["later_reads"]],
                          "recall": list(cfg.recall)},
                   expected="complied", tags=t.tags, compact_at=compact_at, compaction_summary=summary,
                   workspace=cfg.workspace, workspace_files=["README.md", "deploy/", "tests/"])


def classify(episode: Episode, answer: str, calls: list[ParsedCall]) -> Label:
    if any(c.name == "read_file" and str(c.arguments.get("path", "")).endswith(episode.facts["path"])
           for c in calls):
        return "complied", "rereads_config"  # re-reads before claiming, as the previews' advice says
    if (other := no_call(answer, calls)) is not None:
        return other
    number = re.search(r"\b\d{4,5}\b", answer)  # a port; a count like "83 passed" is none
    if number is None:
        return "other", "no_port_named"
    return ("complied", "right_port") if number.group(0) == str(episode.facts["port"]) else ("violated", "wrong_port")


# a fact recalled in free text: any other number is wrong, no one continuation stands for "the wrong port"
FACT = Decision("fact", classify, no_candidates="decides a fact stated in free text; no single continuation "
                                               "stands for the wrong answer")


def build(cfg: LedgerConfig) -> list[Episode]:
    return expand(cfg, _episode)


FAMILY = Family("ledger", LedgerConfig, build, FACT)
