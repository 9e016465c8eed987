"""The seed's TODO list: one in-memory body, eight tool names, three projections.

Seed references (CodeSmith v0.5.0): full-replacement `checklist_write` (todo.rs:343-384), the
single-in-progress invariant (tool_state/todo.rs:153-159), the tool-result snapshot, the
`<system-reminder>` reinjection after compaction (attachment_reinject.rs) and the `[CYCLE STATE]`
seed with its synthetic ack (cycle_manager.rs). Byte formats are the seed's where it quotes them.
Where it does not (the add/update/list tool results, which the seed never shows), the same
snapshot format as `checklist_write` is used so one body has one tool-side spelling.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from harness.types import Episode, Message

from .calls import call_arguments
from .history import SUMMARY, Bridge
from .switch import Switch

REMINDER = "todo_reminder"  # the compaction reinjection
CYCLE = "cycle_state"  # the cycle seed and its ack


class Reinject(StrEnum):
    compaction = "compaction"  # the summary, then the <system-reminder> with the active todos
    cycle = "cycle"  # a new cycle: the [CYCLE STATE] seed and its synthetic ack instead of the summary


@dataclass
class TodoConfig(Switch):
    """The TODO rebuilt where a compacted history (`history: compacted`) lost it."""

    reinject: Reinject = Reinject.compaction


class TodoStatus(str, Enum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"

    @property
    def debug(self) -> str:
        """Rust's `{:?}` spelling of the variant, used by the compaction reinjection."""
        return {"pending": "Pending", "in_progress": "InProgress", "completed": "Completed"}[self.value]

    @property
    def marker(self) -> str:
        return {"pending": "[ ]", "in_progress": "[~]", "completed": "[✓]"}[self.value]


@dataclass
class TodoItem:
    id: int
    content: str
    status: TodoStatus


@dataclass
class TodoList:
    items: list[TodoItem] = field(default_factory=list)
    next_id: int = 1

    def clear(self) -> None:
        self.items.clear()
        self.next_id = 1  # a rebuilt list numbers from 1 again, as in the seed's second snapshot

    def _set_single_in_progress(self, allow_id: int | None) -> None:
        for item in self.items:
            if item.id != allow_id and item.status is TodoStatus.IN_PROGRESS:
                item.status = TodoStatus.PENDING

    def add(self, content: str, status: TodoStatus = TodoStatus.PENDING) -> TodoItem:
        if status is TodoStatus.IN_PROGRESS:
            self._set_single_in_progress(None)
        item = TodoItem(self.next_id, content, status)
        self.next_id += 1
        self.items.append(item)
        return item

    def update(self, item_id: int, status: TodoStatus) -> TodoItem:
        item = next((i for i in self.items if i.id == item_id), None)
        if item is None:
            raise KeyError(f"no todo item with id {item_id}")
        if status is TodoStatus.IN_PROGRESS:
            self._set_single_in_progress(item_id)
        item.status = status
        return item

    def write(self, todos: list[dict[str, Any]]) -> None:
        """`checklist_write`: the complete list; replaces the existing one. Every item is validated
        first, so a bad item leaves the old list as it was."""
        items = [(str(todo["content"]), TodoStatus(todo.get("status", "pending"))) for todo in todos]
        self.clear()
        for content, status in items:
            self.add(content, status)

    @property
    def completion_pct(self) -> int:
        done = sum(i.status is TodoStatus.COMPLETED for i in self.items)
        return done * 100 // len(self.items) if self.items else 0

    @property
    def in_progress(self) -> TodoItem | None:
        return next((i for i in self.items if i.status is TodoStatus.IN_PROGRESS), None)

    def snapshot(self) -> dict[str, Any]:
        current = self.in_progress
        return {"items": [{"id": i.id, "content": i.content, "status": i.status.value} for i in self.items],
                "completion_pct": self.completion_pct, "in_progress_id": current.id if current else None}


# registry.rs:661-671: four canonical names and four compatibility aliases, one shared list
CANONICAL = ("checklist_write", "checklist_add", "checklist_update", "checklist_list")
TOOL_NAMES = CANONICAL + tuple(n.replace("checklist_", "todo_") for n in CANONICAL)


def operation(tool: str) -> str:
    """'write' | 'add' | 'update' | 'list' for any of the eight names."""
    if tool not in TOOL_NAMES:
        raise KeyError(f"not a todo tool: {tool!r}")
    return tool.split("_", 1)[1]


def tool_result(todos: TodoList) -> str:
    """Projection 1: what the tool returns (serde_json::to_string_pretty is 2-space indented)."""
    snap = todos.snapshot()
    pretty = json.dumps(snap, indent=2, ensure_ascii=False)
    return f"Todo list updated ({len(snap['items'])} items, {snap['completion_pct']}% complete)\n{pretty}"


def execute(todos: TodoList, tool: str, args: dict[str, Any]) -> str:
    """Run one todo tool call against the shared list and return its tool result."""
    op = operation(tool)
    if op == "write":
        todos.write(args["todos"])
    elif op == "add":
        todos.add(str(args["content"]), TodoStatus(args.get("status", "pending")))
    elif op == "update":
        todos.update(int(args["id"]), TodoStatus(args["status"]))
    return tool_result(todos)


def replay(messages: list[Message]) -> TodoList:
    """The body as it stands after every todo call of a trajectory (the engine-side state).
    A call the engine would reject (an unknown id, a bad status, a missing field) fails as it would
    there: it returns an error and leaves the list unchanged, so replay skips it. Arguments that
    are not JSON at all raise ConfigError (harness.context.calls)."""
    todos = TodoList()
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call["function"]
            if fn["name"] in TOOL_NAMES:
                args = call_arguments(call)  # ConfigError (a ValueError) must not be swallowed below
                try:
                    execute(todos, fn["name"], args)
                except (KeyError, ValueError, TypeError, AttributeError):
                    continue  # the failed call changed nothing (write validates before replacing)
    return todos


def compaction_reminder(todos: TodoList) -> Message:
    """Projection 2: a `<system-reminder>` user message after compaction; the seed pads no ack."""
    lines = ["Active todos resumed after context compaction:", ""]
    lines += [f"- #{i.id} {i.status.debug}: {i.content}" for i in todos.items]
    return {"role": "user", "content": "<system-reminder>\n" + "\n".join(lines) + "\n</system-reminder>"}


CYCLE_ACK = "Acknowledged. State carried into the new cycle."


def cycle_seed(todos: TodoList, workspace: str, mode: str = "AGENT") -> list[Message]:
    """Projection 3: the `[CYCLE STATE]` seed user message and its synthetic assistant ack.

    to_system_block ends every item with a newline; the message is the seed's quoted text, so the
    final newline is trimmed."""
    body = [
        "[CYCLE STATE — auto-preserved across the cycle boundary]", "",
        "## Cycle State (Auto-Preserved)", "",
        f"- Mode: `{mode}`", f"- Workspace: `{workspace}`", "",
        "### Work", "",
        f"Checklist ({todos.completion_pct}% complete)",
    ] + [f"- {i.status.marker} {i.content}" for i in todos.items]
    return [{"role": "user", "content": "\n".join(body)}, {"role": "assistant", "content": CYCLE_ACK}]


def bridge(episode: Episode, cfg: TodoConfig) -> Bridge:
    """What stands where compaction removed the turns that kept the list."""
    todos = replay(episode.messages)
    if cfg.reinject == Reinject.cycle:
        return [(m, CYCLE) for m in cycle_seed(todos, episode.workspace)]
    return [({"role": "user", "content": episode.compaction_summary}, SUMMARY), (compaction_reminder(todos), REMINDER)]
