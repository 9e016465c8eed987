"""State tracking: a long coding-agent trajectory that keeps a checklist with `checklist_write`.

The question needs the current list: which step is in progress (`ask=current`), which comes next
(`next`) or how many steps remain (`remaining`). The last list update sits
before `compact_at`, so the compaction and cycle conditions must carry the list across the cut;
the messages after it (the recent turns) never mention the list. Conditions to compare:
none (TODO by tool results only), todo_compaction, todo_cycle, status (bar), compacted (nothing).

As a rollout the task goes on: the seed's eight TODO tools run on the environment's list, the work
tools answer as in the trajectory, the user asks the same question after each answer, and each
answer is graded against the list as it stands then; the rollout is finished once every step is
completed. With `rollout.compact_tokens` the history is compacted as it grows, and the compaction
conditions reinject the live list (or open a new cycle with it).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from harness.config.schemas import ScenarioConfig, require
from harness.context import todo
from harness.measure.grading import Label, ParsedCall, no_call
from harness.types import Episode, canonical_json
from scenarios.family import Decision, Family, Live, episode_id, expand
from scenarios.trajectory import Trajectory

GRID_AXES = ("completed_steps", "tool", "ask")
ASKS = ("current", "next", "remaining")


@dataclass
class TodoStateConfig(ScenarioConfig):
    grid_axes = GRID_AXES
    family: str = "todo_state"
    name: str = "todo_state"
    goal: str = "add cursor pagination to the orders API"
    steps: list[str] = field(default_factory=lambda: [
        "Read the orders handler", "Add the cursor parameter to the query",
        "Encode the next-page cursor in responses", "Write tests for pagination",
        "Update the API changelog", "Run the full test suite"])
    # grid axes: steps completed when the question comes; which of the eight names writes the list
    completed_steps: list[int] = field(default_factory=lambda: [1, 3, 4])
    tool: list[str] = field(default_factory=lambda: ["checklist_write", "todo_write"])
    ask: list[str] = field(default_factory=lambda: ["current"])
    work_rounds: int = 3  # tool rounds (reads, edits, test runs) between two list updates
    recent_rounds: int = 2  # rounds after the last update: what survives compaction
    workspace: str = "/home/dev/shop-api"
    files: list[str] = field(default_factory=lambda: [
        "src/orders/handler.py", "src/orders/query.py", "src/orders/cursor.py", "tests/test_orders.py",
        "CHANGELOG.md", "src/db/session.py"])
    questions: dict[str, str] = field(default_factory=lambda: {
        "current": "Quick check before you go on: which checklist step are you working on right now? "
                   "Reply with the step's exact text only.",
        "next": "Quick check before you go on: which checklist step comes after the one you are on now? "
                "Reply with the step's exact text only.",
        "remaining": "Quick check before you go on: how many checklist steps are not completed yet, counting "
                     "the one in progress? Reply with the number only."})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(len(self.steps) >= 2, "scenario.steps", f"needs at least 2 steps, got {len(self.steps)}")
        require(len(set(s.lower() for s in self.steps)) == len(self.steps), "scenario.steps", "steps must differ")
        require(bool(self.completed_steps) and all(0 <= c < len(self.steps) for c in self.completed_steps),
                "scenario.completed_steps", f"each must be in [0, {len(self.steps) - 1}] (one step stays in progress), "
                f"got {list(self.completed_steps)}")
        require(bool(self.tool) and all(t in todo.TOOL_NAMES and todo.operation(t) == "write" for t in self.tool),
                "scenario.tool", f"each must be checklist_write or todo_write, got {list(self.tool)}")
        require(bool(self.ask) and all(a in ASKS and a in self.questions for a in self.ask), "scenario.ask",
                f"each must be one of {ASKS} with a text in scenario.questions, got {list(self.ask)}")
        require("next" not in self.ask or max(self.completed_steps) <= len(self.steps) - 2, "scenario.completed_steps",
                "ask=next needs a pending step after the one in progress")
        require(self.work_rounds >= 1 and self.recent_rounds >= 1, "scenario.work_rounds",
                "work_rounds and recent_rounds must be >= 1")
        require(bool(self.files), "scenario.files", "needs at least one file")


TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}
    for name, desc, props in [
        ("checklist_write", "Write the complete checklist. The complete list of todo items. This replaces the existing list.",
         {"todos": {"type": "array", "items": {"type": "object", "properties": {
             "content": {"type": "string"}, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}}}}}),
        ("todo_write", "Compatibility alias for checklist_write.",
         {"todos": {"type": "array", "items": {"type": "object"}}}),
        ("checklist_list", "Show the current checklist.", {}),
        ("read_file", "Read a file of the workspace.", {"path": {"type": "string"}}),
        ("edit_file", "Replace text in a file.", {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}),
        ("run_tests", "Run the test suite (optionally one path).", {"path": {"type": "string"}}),
    ]]


# the work tools' results, drawn from `rng`: the trajectory's rounds and a rollout's calls answer alike
WORK: dict[str, Callable[[random.Random, dict[str, Any]], str]] = {
    "read_file": lambda rng, args: "\n".join(f"{n:>4}  {rng.choice(CODE)}" for n in range(1, rng.randint(8, 14))),
    "edit_file": lambda rng, args: f"Edited {args.get('path')}: 1 replacement.",
    "run_tests": lambda rng, args: f"{rng.randint(20, 60)} passed, 0 failed in {rng.uniform(1, 9):.2f}s",
}


def _work_round(t: Trajectory, rng: random.Random, files: list[str]) -> None:
    path = rng.choice(files)
    name, args = {"read": ("read_file", {"path": path}),
                  "edit": ("edit_file", {"path": path, "old": "limit=50", "new": "limit=limit"}),
                  "test": ("run_tests", {"path": "tests/"})}[rng.choice(["read", "edit", "test"])]
    t.tool_round("work", name, args, WORK[name](rng, args))


CODE = ["def list_orders(session, limit=50):", "    query = session.query(Order)", "    return query.all()",
        "class Cursor:", "    def encode(self) -> str:", "import base64", "from db import session",
        "    assert response.status_code == 200", "## Unreleased", "    rows = query.limit(limit).all()"]


def _items(steps: list[str], done: int) -> list[dict]:
    return [{"content": s, "status": "completed" if i < done else "in_progress" if i == done else "pending"}
            for i, s in enumerate(steps)]


def list_facts(todos: todo.TodoList, ask: str) -> dict[str, Any]:
    """The answers the list holds: the step in progress (else the first one not completed; None once
    all are), the step after it (the last step is its own next), the steps not completed."""
    items = todos.items
    at = next((k for k, i in enumerate(items) if i.status is todo.TodoStatus.IN_PROGRESS),
              next((k for k, i in enumerate(items) if i.status is not todo.TodoStatus.COMPLETED), None))
    current = items[at].content if at is not None else None
    remaining = sum(i.status is not todo.TodoStatus.COMPLETED for i in items)
    answer = {"current": current, "next": items[min(at + 1, len(items) - 1)].content if at is not None else None,
              "remaining": str(remaining)}[ask]
    return {"answer": answer, "in_progress": current, "completed": len(items) - remaining, "remaining": remaining}


def _episode(cfg: TodoStateConfig, cell: dict, index: int) -> Episode:
    params = {**cell, "index": index, "steps": len(cfg.steps)}
    eid = episode_id(cfg, params)
    rng = random.Random(eid)
    t = Trajectory()
    t.add("system", {"role": "system", "content": (
        "You are a coding agent working in a repository. Keep a checklist of the task with the checklist "
        "tools and follow it step by step.")})
    t.add("request", {"role": "user", "content": f"Please {cfg.goal}. Plan it as a checklist first, then work through it."})
    for done in range(cell["completed_steps"] + 1):
        t.tool_round("todo", cell["tool"], {"todos": _items(cfg.steps, done)},
                     todo.execute(todo.TodoList(), cell["tool"], {"todos": _items(cfg.steps, done)}))
        if done < cell["completed_steps"]:
            for _ in range(cfg.work_rounds):
                _work_round(t, rng, cfg.files)
    compact_at = len(t.messages)
    for _ in range(cfg.recent_rounds):
        _work_round(t, rng, cfg.files)
    t.add("question", {"role": "user", "content": cfg.questions[cell["ask"]]})
    summary = (f"Summary of the conversation so far: the user asked to {cfg.goal}. The agent planned the work as a "
               f"checklist and has been reading, editing and testing files in {cfg.workspace}.")
    return Episode(id=eid, scenario=cfg.name, family=cfg.family, params=params, messages=t.messages, tools=TOOLS,
                   rule=None, target=None,
                   facts=list_facts(todo.replay(t.messages), cell["ask"]),
                   expected="complied", tags=t.tags, status_facts=["todo"], compact_at=compact_at,
                   compaction_summary=summary, workspace=cfg.workspace,
                   workspace_files=list(cfg.files))


def _norm(text: str) -> str:
    return " ".join(text.lower().replace("`", "").split())


NUMBERS = {w: str(n) for n, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                                             "nine", "ten", "eleven", "twelve"])}


# words that mark a step as the one in progress / the next one; either kind ends the other's clause
MARKERS = {"current": r"in[ _]progress|current(?:ly)?|working on", "next": r"\bnext\b|upcoming|after (?:that|it|this)"}
_BOUNDARY = re.compile("|".join(MARKERS.values()) + r"|[\n;]")


def marked_step(answer: str, ask: str, steps: list[str]) -> str | None:
    """The step an answer that names several steps marks as `ask` ("in progress: #3 Write tests",
    "Write tests is in progress, next Update the changelog"): the one step named in the clause right
    after a marker, else right before it (clauses end at a line, a `;` or another marker)."""
    text = "\n".join(_norm(line) for line in answer.splitlines())
    for i, step in enumerate(steps):  # mask the steps, so a marker word inside one ("next-page") is no marker
        text = text.replace(_norm(step), f"\x00{i}\x00")
    for m in re.finditer(MARKERS[ask], text):
        after = text[m.end():]
        end = _BOUNDARY.search(after)
        before = text[:m.start()]
        start = max((b.end() for b in _BOUNDARY.finditer(before)), default=0)
        for clause in (after[:end.start()] if end else after, before[start:]):
            named = set(re.findall(r"\x00(\d+)\x00", clause))
            if len(named) == 1:
                return steps[int(named.pop())]
    return None


def classify(episode: Episode, answer: str, calls: list[ParsedCall]) -> Label:
    """complied: names the expected step and no other step, or quotes the state (several steps) and
    marks the expected one as current / next (ask=remaining: its first number is the count);
    violated: names or marks another step or number (a stale or wrong state); other: a tool call or
    nothing recognisable."""
    if (other := no_call(answer, calls)) is not None:
        return other
    text = _norm(answer)
    right = episode.facts["answer"]
    if episode.params["ask"] == "remaining":
        first = re.search(r"\b(\d+|" + "|".join(NUMBERS) + r")\b", text)
        if first is None:
            return "other", "no_count"
        return ("complied", "right_count") if NUMBERS.get(first.group(1), first.group(1)) == right else ("violated", "wrong_count")
    steps = [i.content for i in todo.replay(episode.messages).items]
    named = {step for step in steps if _norm(step) in text}
    if len(named) > 1:
        marked = marked_step(answer, episode.params["ask"], steps)
        named = {marked} if marked else named
    if named == {right}:
        return "complied", "right_step"
    return ("violated", "wrong_step") if named else ("other", "no_step_named")


# a step named in free text, not a call: no single continuation stands for the wrong answer
TODO_STEP = Decision("todo_step", classify, no_candidates=(
    "decides a step named in free text; no single continuation stands for the wrong answer"))


def _simulate(episode: Episode, name: str, args: dict[str, Any]) -> str | None:
    if name not in WORK:
        return None  # the TODO tools run on the environment's list
    return WORK[name](random.Random(f"{episode.id}:{name}:{canonical_json(args)}"), args)


def judge(episode: Episode) -> Episode:
    """The answer as the live list stands (the list the engine holds, whatever the view shows)."""
    return replace(episode, facts=list_facts(todo.replay(episode.messages), episode.params["ask"]))


def _done(episode: Episode) -> bool:
    items = todo.replay(episode.messages).items
    return bool(items) and all(i.status is todo.TodoStatus.COMPLETED for i in items)


def build(cfg: TodoStateConfig) -> list[Episode]:
    return expand(cfg, _episode)


FAMILY = Family("todo_state", TodoStateConfig, build, TODO_STEP, Live(_simulate, judge, _done, todo=True))
