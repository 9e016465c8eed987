"""The TODO list: golden projections against the seed's quoted text, and the invariant as properties."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.context import todo
from harness.context.todo import TodoList, TodoStatus

THREE = [{"content": "Plan it out", "status": "completed"}, {"content": "Wire the thing", "status": "in_progress"},
         {"content": "Run gates", "status": "pending"}]

REMINDER = """<system-reminder>
Active todos resumed after context compaction:

- #1 Completed: Plan it out
- #2 InProgress: Wire the thing
- #3 Pending: Run gates
</system-reminder>"""

CYCLE = """[CYCLE STATE — auto-preserved across the cycle boundary]

## Cycle State (Auto-Preserved)

- Mode: `AGENT`
- Workspace: `/Users/dev/CodeSmith`

### Work

Checklist (33% complete)
- [✓] Plan it out
- [~] Wire the thing
- [ ] Run gates"""


def _three() -> TodoList:
    todos = TodoList()
    todos.write(THREE)
    return todos


@pytest.mark.parametrize("golden", [REMINDER, CYCLE, "Acknowledged. State carried into the new cycle.",
                                    "Todo list updated (3 items, 33% complete)"])
def test_goldens_are_the_seeds_quoted_text(golden, seed_text):
    assert golden in seed_text


def test_tool_result_snapshot_matches_the_seed():
    result = todo.execute(TodoList(), "checklist_write", {"todos": THREE})
    header, body = result.split("\n", 1)
    assert header == "Todo list updated (3 items, 33% complete)"
    assert json.loads(body) == {"items": [{"id": 1, "content": "Plan it out", "status": "completed"},
                                          {"id": 2, "content": "Wire the thing", "status": "in_progress"},
                                          {"id": 3, "content": "Run gates", "status": "pending"}],
                                "completion_pct": 33, "in_progress_id": 2}
    # pretty JSON as serde_json::to_string_pretty writes it (the seed compressed the indentation for print)
    assert body.startswith('{\n  "items": [\n    {\n      "id": 1,\n      "content": "Plan it out",')
    assert list(json.loads(body)) == ["items", "completion_pct", "in_progress_id"]


def test_compaction_reminder_is_byte_identical_and_has_no_ack():
    msg = todo.compaction_reminder(_three())
    assert msg == {"role": "user", "content": REMINDER}


def test_cycle_seed_is_byte_identical_with_its_ack():
    seed, ack = todo.cycle_seed(_three(), "/Users/dev/CodeSmith")
    assert seed == {"role": "user", "content": CYCLE}
    assert ack == {"role": "assistant", "content": "Acknowledged. State carried into the new cycle."}


def test_eight_names_share_one_list():
    assert len(set(todo.TOOL_NAMES)) == 8
    todos = TodoList()
    todo.execute(todos, "todo_write", {"todos": THREE[:1]})
    todo.execute(todos, "checklist_add", {"content": "Wire the thing", "status": "in_progress"})
    todo.execute(todos, "todo_add", {"content": "Run gates"})
    todo.execute(todos, "todo_update", {"id": 2, "status": "completed"})
    todo.execute(todos, "checklist_update", {"id": 3, "status": "in_progress"})
    assert todo.execute(todos, "todo_list", {}) == todo.execute(todos, "checklist_list", {})
    assert [(i.id, i.status.value) for i in todos.items] == [(1, "completed"), (2, "completed"), (3, "in_progress")]
    with pytest.raises(KeyError):
        todo.operation("todo_delete")


def test_write_replaces_the_whole_list_and_renumbers():
    todos = _three()
    todo.execute(todos, "checklist_write", {"todos": [{"content": "Only this", "status": "pending"}]})
    assert todos.snapshot() == {"items": [{"id": 1, "content": "Only this", "status": "pending"}],
                                "completion_pct": 0, "in_progress_id": None}


STATUS = st.sampled_from(list(TodoStatus))
LINE = st.characters(blacklist_characters="\n\r")
OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.text(max_size=8), STATUS),
    st.tuples(st.just("update"), st.integers(1, 12), STATUS),
    st.tuples(st.just("write"), st.lists(st.tuples(st.text(max_size=8), STATUS), max_size=6), st.none()),
), max_size=25)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(OPS)
def test_at_most_one_item_is_in_progress(ops):
    todos = TodoList()
    for op, a, b in ops:
        if op == "add":
            item = todos.add(a, b)
            if b is TodoStatus.IN_PROGRESS:
                assert todos.in_progress is item  # the new one wins, every other was demoted
        elif op == "update" and any(i.id == a for i in todos.items):
            others = {i.id: i.status for i in todos.items if i.id != a}
            todos.update(a, b)
            if b is TodoStatus.IN_PROGRESS:
                assert todos.in_progress.id == a
            # only in_progress items are touched, and only by demotion to pending
            for i in todos.items:
                if i.id != a and i.status != others[i.id]:
                    assert others[i.id] is TodoStatus.IN_PROGRESS and i.status is TodoStatus.PENDING
        elif op == "write":
            todos.write([{"content": c, "status": s.value} for c, s in a])
            assert [i.id for i in todos.items] == list(range(1, len(a) + 1))
        assert sum(i.status is TodoStatus.IN_PROGRESS for i in todos.items) <= 1
        snap = todos.snapshot()
        assert snap["in_progress_id"] == (todos.in_progress.id if todos.in_progress else None)
        assert 0 <= snap["completion_pct"] <= 100


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.text(LINE, min_size=1, max_size=10), STATUS), max_size=8))
def test_projections_agree_with_the_snapshot(items):
    todos = TodoList()
    todos.write([{"content": c, "status": s.value} for c, s in items])
    header = todo.tool_result(todos).split("\n", 1)[0]
    assert header == f"Todo list updated ({len(todos.items)} items, {todos.completion_pct}% complete)"
    reminder = todo.compaction_reminder(todos)["content"]
    assert reminder.count("\n- #") == len(todos.items)
    seed = todo.cycle_seed(todos, "/w")[0]["content"]
    assert f"Checklist ({todos.completion_pct}% complete)" in seed
    assert seed.count("\n- [~] ") == (todos.in_progress is not None)


def _traj(*calls: tuple[str, object]) -> list[dict]:
    return [{"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}]}
        for i, (name, args) in enumerate(calls)]


def test_replay_skips_a_call_the_engine_would_reject():
    good = _traj(("checklist_write", {"todos": THREE}), ("checklist_update", {"id": 2, "status": "in_progress"}))
    bad = [("checklist_update", {"id": 9, "status": "completed"}), ("checklist_update", {"id": 1, "status": "done"}),
           ("checklist_update", {"id": "x", "status": "completed"}), ("checklist_add", {}),
           ("checklist_write", {"todos": [{"content": "a"}, {"content": "b", "status": "??"}]})]
    mixed = good[:1] + _traj(*bad) + good[1:]
    assert todo.replay(mixed).snapshot() == todo.replay(good).snapshot()


def test_replay_names_malformed_arguments():
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tool call c0 \(checklist_write\): arguments are not valid JSON"):
        todo.replay(_traj(("checklist_write", '{"todos": [')))
    with pytest.raises(ConfigError, match="must be a JSON object, got list"):
        todo.replay(_traj(("checklist_write", "[1]")))
