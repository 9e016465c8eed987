"""A user's own agent trajectories, with a rule per trace; the bar is computed from their calls.

`scenario.path` is a JSONL file (one trace a line), a `.parquet` file or a `datasets`
`save_to_disk` folder. A trace: {"id": optional, "messages": [OpenAI chat messages with
tool_calls], "tools": optional, "rule": {"tool", "arg", "target", "limit"} (optional when the
scenario gives a default rule)} meaning "at most `limit` calls of `tool` with `arg` = `target`".
The trace is cut after its last user message (that is the question the model answers); the
expectation is computed by code: `refused` when the calls already made reach the limit, else
`complied`. Rows exported by `harness.dataset` are recognised and rebuilt as the exact episodes
of their own family, so a frozen grid reruns unchanged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from harness.config import ScenarioConfig, require
from harness.context.calls import call_arguments, calls_target
from harness.errors import ConfigError
from harness.context.status import tally
from harness.jsonl import iter_lines
from harness.grading import grade
from harness.types import Episode, Rule, short_hash

from . import register

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class TracesConfig(ScenarioConfig):
    family: str = "traces"
    name: str = "traces"
    path: str = "scenarios/data/example_traces.jsonl"
    # the rule of traces that carry none; all four or none
    rule_tool: Optional[str] = None
    rule_arg: Optional[str] = None
    rule_target: Optional[str] = None
    rule_limit: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        parts = (self.rule_tool, self.rule_arg, self.rule_target, self.rule_limit)
        require(all(p is None for p in parts) or all(p is not None for p in parts), "scenario.rule_tool",
                "set all of rule_tool, rule_arg, rule_target, rule_limit or none of them")
        require(self.rule_limit is None or self.rule_limit >= 1, "scenario.rule_limit", f"must be >= 1, got {self.rule_limit}")

    def check_machine(self) -> None:
        require(Path(self.path).expanduser().exists(), "scenario.path", f"{self.path!r} does not exist")


def _clean(obj: Any) -> Any:
    """Arrow fills absent keys with None when a list of messages becomes a table; drop them again."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items() if v is not None or k == "content"}
    return [_clean(v) for v in obj] if isinstance(obj, list) else obj


def _rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return [row for _, row in iter_lines(path.read_text(encoding="utf-8"), f"scenario.path: {path}", ConfigError)]
    from harness.dataset import load_rows

    return load_rows(path)


def target_calls(messages: list[dict[str, Any]], rule: Rule, target: str) -> int:
    """Calls already made to the target, matched as the grader matches a new call
    (`harness.grading.calls_target`): tool name case-insensitive, the target case-insensitive on word
    boundaries in the rule's argument (or in any argument when the call lacks it), so the
    expectation and the labels agree."""
    return sum(calls_target((call.get("function") or {}).get("name"), call_arguments(call), rule.tool, rule.arg, target)
               for m in messages for call in m.get("tool_calls") or [])


def _trace_episode(cfg: TracesConfig, row: dict[str, Any], n: int) -> Episode:
    where = f"scenario.path: trace {n} ({row.get('id', 'no id')})"
    messages = row.get("messages")
    messages = _clean(json.loads(messages) if isinstance(messages, str) else messages)
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") in ROLES for m in messages):
        raise ConfigError(f"{where}: messages must be a list of chat messages with roles {ROLES}")
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ConfigError(f"{where}: has no user message to answer")
    messages = messages[:last_user + 1]
    raw_rule = row.get("rule")
    raw_rule = json.loads(raw_rule) if isinstance(raw_rule, str) else raw_rule
    if raw_rule is None and cfg.rule_tool is None:
        raise ConfigError(f"{where}: has no rule and the scenario sets no rule_tool/rule_arg/rule_target/rule_limit")
    r = raw_rule or {"tool": cfg.rule_tool, "arg": cfg.rule_arg, "target": cfg.rule_target, "limit": cfg.rule_limit}
    try:
        rule, target = Rule(str(r["tool"]), str(r["arg"]), int(r["limit"])), str(r["target"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}: rule needs tool, arg, target and an integer limit, got {r!r}") from None
    tools = row.get("tools") or []
    tools = _clean(json.loads(tools) if isinstance(tools, str) else tools)
    for i, m in enumerate(messages):  # malformed arguments fail here, naming the trace and the message
        for call in m.get("tool_calls") or []:
            call_arguments(call, f"{where}, message {i}")
    facts = tally(messages, rule, target)
    made = target_calls(messages, rule, target)
    trace_id = str(row.get("id") or short_hash({"messages": messages, "rule": r}))
    params = {"trace": trace_id, "calls_made": made, "limit": rule.limit, "messages": len(messages)}
    return Episode(id=short_hash({"scenario": cfg.name, "trace": trace_id, "rule": r, "messages": messages}),
                   scenario=cfg.name, family=cfg.family, params=params, messages=messages, tools=tools, rule=rule,
                   target=target, facts={"calls_by_target": facts.calls_by_target, "calls_by_tool": facts.calls_by_tool,
                                         "limit": rule.limit, "target": target, "tool": rule.tool},
                   expected="refused" if made >= rule.limit else "complied", tags=[m["role"] for m in messages])


@register("traces", TracesConfig, grade=grade)
def build(cfg: TracesConfig) -> list[Episode]:
    from harness.dataset import row_episode

    episodes: dict[str, Episode] = {}
    for n, row in enumerate(_rows(Path(cfg.path).expanduser()), 1):
        ep = row_episode(row) if "expected" in row and "family" in row else _trace_episode(cfg, row, n)
        episodes.setdefault(ep.id, ep)  # an exported grid has one row per condition
    if not episodes:
        raise ConfigError(f"scenario.path: {cfg.path} holds no traces")
    return list(episodes.values())
