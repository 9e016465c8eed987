"""A user's own agent trajectories, with a rule per trace; the bar is computed from their calls.

`scenario.path` is a JSONL file (one trace a line), a `.parquet` file or a `datasets`
`save_to_disk` folder. A trace: {"id": optional, "messages": [OpenAI chat messages with
tool_calls], "tools": optional, "rule": {"tool", "arg", "target", "limit"} (optional when the
scenario gives a default rule)} meaning "at most `limit` calls of `tool` with `arg` = `target`".
The trace is cut after its last user message (that is the question the model answers); the
expectation is computed by code: `refused` when the calls already made reach the limit, else
`complied`. Rows exported by `harness.tools.dataset` are recognised and rebuilt as the exact episodes
of their own family, so a frozen grid reruns unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from harness.config.schemas import ScenarioConfig, require
from harness.context.calls import call_arguments
from harness.context.status import tally
from harness.errors import ConfigError
from harness.io.jsonl import open_regular, parse_line, read_lines
from harness.measure.grading import target_calls
from harness.types import Episode, Rule, short_hash
from scenarios.family import CALL_LIMIT, CALL_LIMIT_LIVE, Family
from scenarios.rows import load_rows, row_episode

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

    def planned_episodes(self) -> None:
        return None  # one per trace, known once the file is read (make_plan checks the size then)

    def __post_init__(self) -> None:
        super().__post_init__()
        parts = (self.rule_tool, self.rule_arg, self.rule_target, self.rule_limit)
        require(all(p is None for p in parts) or all(p is not None for p in parts), "scenario.rule_tool",
                "set all of rule_tool, rule_arg, rule_target, rule_limit or none of them")
        require(self.rule_limit is None or self.rule_limit >= 1, "scenario.rule_limit", f"must be >= 1, got {self.rule_limit}")
        require(self.rule_target is None or bool(self.rule_target.strip()), "scenario.rule_target",
                "must name a target (an empty one matches every argument)")

    def check_machine(self) -> None:
        require(Path(self.path).expanduser().exists(), "scenario.path", f"{self.path!r} does not exist")


def _clean(obj: Any) -> Any:
    """Arrow fills absent keys with None when a list of messages becomes a table; drop them again."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items() if v is not None or k == "content"}
    return [_clean(v) for v in obj] if isinstance(obj, list) else obj


def _rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row): "scenario.path: FILE line N" for JSONL, "... row N" for a dataset."""
    if path.suffix == ".jsonl":
        return [(f"scenario.path: {path} line {n}", row) for n, row in read_lines(path, f"scenario.path: {path}", ConfigError)]
    if not path.is_dir():  # a FIFO (which would block the reader) or a device is named for what it is
        with open_regular(path, f"scenario.path: {path}", ConfigError):
            pass
        if path.suffix != ".parquet":
            raise ConfigError(f"scenario.path: {path} is a file but not a .jsonl or .parquet one; traces are a JSONL "
                              "file, a .parquet file or a datasets save_to_disk folder")

    return [(f"scenario.path: {path} row {n}", row) for n, row in enumerate(load_rows(path), 1)]


def _json_field(row: dict[str, Any], key: str, where: str) -> Any:
    """A field that a dataset stores as JSON text and a JSONL line as the value itself."""
    value = row.get(key)
    if not isinstance(value, str):
        return value
    return parse_line(value, f"{where}, field {key!r}", 1, ConfigError)


def _check_rule(r: Any, where: str) -> tuple[Rule, str]:
    if not isinstance(r, dict):
        raise ConfigError(f"{where}: field 'rule' must be an object with tool, arg, target and limit, got {type(r).__name__}")
    for key in ("tool", "arg", "target"):
        if not isinstance(r.get(key), str) or not r[key].strip():
            raise ConfigError(f"{where}: field 'rule.{key}' must be a non-empty string, got {r.get(key)!r:.60}")
    limit = r.get("limit")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"{where}: field 'rule.limit' must be an integer >= 1, got {limit!r:.60}")
    return Rule(r["tool"], r["arg"], limit), r["target"]


def _check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise ConfigError(f"{where}: field 'messages' must be a list of chat messages, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ConfigError(f"{where}: messages[{i}] must be a chat message with a role in {ROLES}")
        if m.get("content") is not None and not isinstance(m["content"], (str, list)):
            raise ConfigError(f"{where}: messages[{i}].content must be a string, a list of parts or null, "
                              f"got {type(m['content']).__name__}")
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
                for c in calls)):
            raise ConfigError(f"{where}: messages[{i}].tool_calls must be a list of calls "
                              '{"function": {"name": ..., "arguments": ...}}')
    return messages


def _trace_episode(cfg: TracesConfig, row: dict[str, Any], where: str) -> Episode:
    if row.get("id") is not None and not isinstance(row["id"], (str, int)):
        raise ConfigError(f"{where}: field 'id' must be a string or an integer, got {type(row['id']).__name__}")
    where += f" (trace {row['id']})" if row.get("id") is not None else ""
    messages = _check_messages(_clean(_json_field(row, "messages", where)), where)
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ConfigError(f"{where}: has no user message to answer")
    messages = messages[:last_user + 1]
    raw_rule = _json_field(row, "rule", where)
    if raw_rule is None and cfg.rule_tool is None:
        raise ConfigError(f"{where}: has no rule and the scenario sets no rule_tool/rule_arg/rule_target/rule_limit")
    r = raw_rule if raw_rule is not None else {"tool": cfg.rule_tool, "arg": cfg.rule_arg, "target": cfg.rule_target,
                                               "limit": cfg.rule_limit}
    rule, target = _check_rule(r, where)
    tools = _clean(_json_field(row, "tools", where) or [])
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ConfigError(f"{where}: field 'tools' must be a list of tool objects")
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


def build(cfg: TracesConfig) -> list[Episode]:
    episodes: dict[str, Episode] = {}
    for where, row in _rows(Path(cfg.path).expanduser()):
        try:
            ep = row_episode(row, where) if "expected" in row and "family" in row else _trace_episode(cfg, row, where)
        except RecursionError:  # parsed, but too deep to walk, hash or render
            raise ConfigError(f"{where}: nested too deeply to use") from None
        episodes.setdefault(ep.id, ep)  # an exported grid has one row per condition
    if not episodes:
        raise ConfigError(f"scenario.path: {cfg.path} holds no traces")
    return list(episodes.values())


FAMILY = Family("traces", TracesConfig, build, CALL_LIMIT, CALL_LIMIT_LIVE)
