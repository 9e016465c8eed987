"""The `<agent_status>` bar: facts counted by code from a trajectory's tool calls, then rendered.

Two renderings of the same facts:
- prose: the seed's sentence, byte for byte in the seed's case (it names only the rule's tool;
  calls of other tools are left out): `<agent_status>phone_call called 3 times, Xfinity at limit 3/3</agent_status>`
- kv: key-value lines with the explicit constraint check `Maximum calls to Xfinity reached (3/3)`.
Either can leave the limit out (`limit_shown`), keeping the names and counts: the control for the bar's vocabulary.

A family picks which kinds of facts its bar shows (`Episode.status_facts`): `calls` (per tool and
per value of the rule's argument), `todo` (the list replayed from the todo tools), `repeats`
(calls made more than once with identical arguments), `failures` (the current failure streak).
Facts can be corrupted (a seeded fraction off by one) and volatile side-channel signals added;
the tags can carry `visibility="internal"` and a `<system-reminder>` wrapper.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum

from harness.types import Message, Rule, canonical_json

from . import todo as todo_mod
from .calls import call_arguments, calls_target, same_tool
from .loop_guard import is_failure


@dataclass(frozen=True)
class StatusFacts:
    calls_by_tool: dict[str, int]  # in order of first call
    calls_by_target: dict[str, int]  # calls of the rule's tool per value of its argument
    rule: Rule | None  # None: the family has no call limit; the bar counts calls per tool only
    # (id, content, status) of the replayed todo list; empty when no todo tool was called
    todo: tuple[tuple[int, str, str], ...] = ()
    repeats: dict[str, int] = field(default_factory=dict)  # "tool {canonical args}" -> count, count >= 2
    failure_streak: tuple[str, int] | None = None  # (tool of the last failure, consecutive failures)
    volatile: dict[str, str] = field(default_factory=dict)  # side-channel signals, shown when set
    limit_shown: bool = True  # false: counts only, the rule's limit and its check left out


def tally(messages: list[Message], rule: Rule | None, target: str | None = None) -> StatusFacts:
    """Count the trajectory's calls. Calls to `target` (the episode's) are counted under its name with
    the grader's matcher (harness.context.calls.calls_target: any case, on word boundaries), so the bar
    and the expectation agree; other values of the rule's argument are counted as written. The target
    is always a key of calls_by_target, with 0 when never called, so the bar names it from the first
    turn; keys are in first-call order."""
    by_tool: Counter[str] = Counter()
    by_target: Counter[str] = Counter()
    same: Counter[str] = Counter()
    names: dict[str, str] = {}
    streak: tuple[str, int] | None = None
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call["function"]
            args = call_arguments(call)
            by_tool[fn["name"]] += 1
            same[f"{fn['name']} {canonical_json(args)}"] += 1
            names[call.get("id", "")] = fn["name"]
            if target is not None and calls_target(fn["name"], args, rule.tool, rule.arg, target):
                by_target[target] += 1  # "xfinity", "Xfinity support": the grader's call to Xfinity
            elif rule is not None and same_tool(fn["name"], rule.tool):
                by_target[str(args.get(rule.arg, "?"))] += 1
        if message.get("role") == "tool":
            failed = is_failure(message.get("content") or "")
            tool = message.get("name") or names.get(message.get("tool_call_id", ""), "?")
            streak = (tool, (streak[1] if streak else 0) + 1) if failed else None
    if target is not None:
        by_target.setdefault(target, 0)
    todos = todo_mod.replay(messages)
    return StatusFacts(dict(by_tool), dict(by_target), rule,
                       todo=tuple((i.id, i.content, i.status.value) for i in todos.items),
                       repeats={k: n for k, n in same.items() if n >= 2}, failure_streak=streak)


def corrupt(f: StatusFacts, fraction: float, key: str, kinds: tuple[str, ...] = ("calls",)) -> StatusFacts:
    """Make round(fraction * n) of the n shown facts wrong (at least one when fraction > 0): a count
    off by one, or the in-progress todo moved to a neighbour. Seeded by `key` (the episode id)."""
    slots: list[tuple[str, str]] = []
    if "calls" in kinds:
        slots += [("calls_by_tool", k) for k in f.calls_by_tool] + [("calls_by_target", k) for k in f.calls_by_target]
    if "todo" in kinds and f.todo:
        slots.append(("todo", ""))
    if "repeats" in kinds:
        slots += [("repeats", k) for k in f.repeats]
    if "failures" in kinds and f.failure_streak:
        slots.append(("failure_streak", ""))
    if not slots or fraction <= 0:
        return f
    rng = random.Random(f"corrupt:{key}")
    n = min(len(slots), max(1, round(fraction * len(slots))))
    out = {"calls_by_tool": dict(f.calls_by_tool), "calls_by_target": dict(f.calls_by_target),
           "repeats": dict(f.repeats), "todo": f.todo, "failure_streak": f.failure_streak}

    def shift(v: int) -> int:
        return v + 1 if v == 0 or rng.random() < 0.5 else v - 1

    for name, k in rng.sample(slots, n):
        if name == "todo":
            statuses = [s for _, _, s in f.todo]
            cur = statuses.index("in_progress") if "in_progress" in statuses else 0
            new = (cur + 1) % len(statuses) if len(statuses) > 1 else cur
            out["todo"] = tuple((i, c, "in_progress" if j == new else ("pending" if s == "in_progress" else s))
                                for j, (i, c, s) in enumerate(f.todo))
        elif name == "failure_streak":
            tool, count = f.failure_streak
            out["failure_streak"] = (tool, max(1, shift(count)))
        else:
            out[name][k] = shift(out[name][k])
    return replace(f, **out)


def _times(n: int) -> str:
    return f"{n} time" if n == 1 else f"{n} times"


def _todo_summary(f: StatusFacts) -> tuple[int, str | None, str | None, int]:
    """(percent complete, in-progress item, next pending item, remaining count)."""
    done = sum(s == "completed" for _, _, s in f.todo)
    current = next((f"#{i} {c}" for i, c, s in f.todo if s == "in_progress"), None)
    nxt = next((f"#{i} {c}" for i, c, s in f.todo if s == "pending"), None)
    return done * 100 // len(f.todo), current, nxt, len(f.todo) - done


def _prose_calls(f: StatusFacts) -> str:
    if f.rule is None:
        return ", ".join(f"{t} called {_times(n)}" for t, n in f.calls_by_tool.items()) or "no tool calls yet"
    limit, tool = f.rule.limit, f.rule.tool
    parts = []
    head = f"{tool} called {_times(f.calls_by_tool.get(tool, 0))}"
    if len(f.calls_by_target) > 1:
        head += " (" + ", ".join(f"{t} {n}" for t, n in f.calls_by_target.items()) + ")"
    parts.append(head)
    for target, n in f.calls_by_target.items():
        if not f.limit_shown:
            parts.append(f"{target} {_times(n)}")
            continue
        state = "at limit" if n == limit else "over limit" if n > limit else "at"
        parts.append(f"{target} {state} {n}/{limit}")
    return ", ".join(parts)  # the rule's tool only (the seed's sentence); kv lists every tool


def render_prose(f: StatusFacts, kinds: tuple[str, ...] = ("calls",)) -> str:
    clauses = []
    if "calls" in kinds:
        clauses.append(_prose_calls(f))
    if "todo" in kinds and f.todo:
        pct, current, nxt, left = _todo_summary(f)
        clauses.append(f"todo list {pct}% complete with {left} remaining, in progress {current or 'none'}, "
                       f"next {nxt or 'none'}")
    if "repeats" in kinds:
        clauses += [f"{k.split(' ', 1)[0]} called {_times(n)} with the same arguments {k.split(' ', 1)[1]}"
                    for k, n in f.repeats.items()] or ["no call repeated with the same arguments"]
    if "failures" in kinds and f.failure_streak:
        clauses.append(f"{f.failure_streak[0]} failed {_times(f.failure_streak[1])} in a row")
    clauses += [f"{k} {v}" for k, v in f.volatile.items()]
    return "; ".join(clauses) or "no tool calls yet"


def render_kv(f: StatusFacts, kinds: tuple[str, ...] = ("calls",)) -> str:
    lines = []
    if "calls" in kinds and f.rule is None:
        lines += [f"{name}: {n} calls" for name, n in f.calls_by_tool.items()] or ["no tool calls yet"]
    elif "calls" in kinds:
        limit, tool, arg = f.rule.limit, f.rule.tool, f.rule.arg
        for name, n in f.calls_by_tool.items():
            line = f"{name}: {n} calls"
            if name == tool and f.calls_by_target:
                line += " (" + ", ".join(f"{t}: {c}" for t, c in f.calls_by_target.items()) + ")"
            lines.append(line)
        if tool not in f.calls_by_tool:
            lines.append(f"{tool}: 0 calls")
        if not f.limit_shown:  # the per-target lines' words and counts, no limit
            lines += [f"Calls to {target}: {n}" for target, n in f.calls_by_target.items()]
        else:
            lines.append(f"limit: {limit} {tool} calls per {arg}")
            for target, n in f.calls_by_target.items():
                lines.append(f"Maximum calls to {target} reached ({n}/{limit})" if n >= limit else f"Calls to {target}: {n}/{limit}")
    if "todo" in kinds and f.todo:
        pct, current, nxt, left = _todo_summary(f)
        lines += [f"todo: {len(f.todo)} items, {pct}% complete, {left} remaining",
                  f"in progress: {current or 'none'}", f"next: {nxt or 'none'}"]
    if "repeats" in kinds:
        lines += [f"identical calls: {k} x{n}" for k, n in f.repeats.items()] or ["identical calls: none"]
    if "failures" in kinds and f.failure_streak:
        lines.append(f"consecutive failures: {f.failure_streak[1]} ({f.failure_streak[0]})")
    lines += [f"{k}: {v}" for k, v in f.volatile.items()]
    return "\n".join(lines)


RENDERERS = {"prose": render_prose, "kv": render_kv}


class Wrapper(Enum):
    """What the `<agent_status>` tag is wrapped in: the member's value with `{bar}` for the tag. A new
    wrapper is one member here and one condition preset (the analysis finds the bar by its marks)."""

    none = "{bar}"
    system_reminder = "<system-reminder>\n{bar}\n</system-reminder>"


def wrapper_tags() -> list[str]:
    """The text every wrapper puts around the bar (`<system-reminder>`, `</system-reminder>`): what an
    answer that only echoes a bar may hold besides the `<agent_status>` block."""
    return sorted({piece.strip() for w in Wrapper for piece in w.value.split("{bar}") if piece.strip()})


def tag(body: str, fmt: str, internal: bool = False, wrapper: Wrapper = Wrapper.none) -> str:
    """`<agent_status>` around the body (kv on its own lines, prose inline), optionally with
    `visibility="internal"`, in the wrapper."""
    open_tag = '<agent_status visibility="internal">' if internal else "<agent_status>"
    text = f"{open_tag}\n{body}\n</agent_status>" if fmt == "kv" else f"{open_tag}{body}</agent_status>"
    return wrapper.value.replace("{bar}", text)
