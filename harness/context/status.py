"""The `<agent_status>` bar: facts counted by code from a trajectory's tool calls, then rendered.

Two renderings of the same facts:
- prose: the seed's sentence, byte for byte in the seed's case:
  `<agent_status>phone_call called 3 times, Xfinity at limit 3/3</agent_status>`
- kv: key-value lines with the explicit constraint check `Maximum calls to Xfinity reached (3/3)`.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from harness.types import Message, Rule


@dataclass(frozen=True)
class StatusFacts:
    calls_by_tool: dict[str, int]  # in order of first call
    calls_by_target: dict[str, int]  # calls of the rule's tool per value of its argument
    rule: Rule


def tally(messages: list[Message], rule: Rule) -> StatusFacts:
    by_tool: Counter[str] = Counter()
    by_target: Counter[str] = Counter()
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call["function"]
            by_tool[fn["name"]] += 1
            if fn["name"] == rule.tool:
                args = fn["arguments"]
                args = json.loads(args) if isinstance(args, str) else args
                by_target[str(args.get(rule.arg, "?"))] += 1
    return StatusFacts(dict(by_tool), dict(by_target), rule)


def _times(n: int) -> str:
    return f"{n} time" if n == 1 else f"{n} times"


def render_prose(f: StatusFacts) -> str:
    limit, tool = f.rule.limit, f.rule.tool
    parts = []
    n_rule = f.calls_by_tool.get(tool, 0)
    head = f"{tool} called {_times(n_rule)}"
    if len(f.calls_by_target) > 1:
        head += " (" + ", ".join(f"{t} {n}" for t, n in f.calls_by_target.items()) + ")"
    parts.append(head)
    for target, n in f.calls_by_target.items():
        state = "at limit" if n == limit else "over limit" if n > limit else "at"
        parts.append(f"{target} {state} {n}/{limit}")
    text = ", ".join(parts)
    others = [f"{t} called {_times(n)}" for t, n in f.calls_by_tool.items() if t != tool]
    if others:
        text += "; " + ", ".join(others)
    return f"<agent_status>{text}</agent_status>"


def render_kv(f: StatusFacts) -> str:
    limit, tool, arg = f.rule.limit, f.rule.tool, f.rule.arg
    lines = []
    for name, n in f.calls_by_tool.items():
        line = f"{name}: {n} calls"
        if name == tool and f.calls_by_target:
            line += " (" + ", ".join(f"{t}: {c}" for t, c in f.calls_by_target.items()) + ")"
        lines.append(line)
    if tool not in f.calls_by_tool:
        lines.append(f"{tool}: 0 calls")
    lines.append(f"limit: {limit} {tool} calls per {arg}")
    for target, n in f.calls_by_target.items():
        lines.append(f"Maximum calls to {target} reached ({n}/{limit})" if n >= limit else f"Calls to {target}: {n}/{limit}")
    return "<agent_status>\n" + "\n".join(lines) + "\n</agent_status>"


RENDERERS = {"prose": render_prose, "kv": render_kv}


def status_block(messages: list[Message], rule: Rule, fmt: str = "kv") -> str:
    return RENDERERS[fmt](tally(messages, rule))
