"""The todo_state, loop_guard and failure_streak families: episodes, ground truth, graders, and a
scripted end-to-end run with one report row per condition."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import scenarios
from harness.context import apply, todo
from harness.context.loop_guard import is_failure
from harness.context.status import tally
from harness.errors import ConfigError
from harness.run import first_steps
from harness.types import Completion
from tests.conftest import make_cfg, run_cli

TODO_CONDITIONS = "[none,todo_compaction,todo_cycle,status_tail,compacted]"


def _eps(name: str, *overrides: str):
    return scenarios.build_episodes(make_cfg(f"scenario={name}", *overrides).scenario)


def _say(text: str = "", call: dict | None = None) -> Completion:
    return Completion(text=text + (f"<tool_call>{json.dumps(call)}</tool_call>" if call else ""))


def test_todo_state_ground_truth_and_compaction_point():
    eps = _eps("todo_state", "scenario.tool=[checklist_write,todo_write]")
    assert len(eps) == 18 and len({e.id for e in eps}) == 18
    for ep in eps:
        state = todo.replay(ep.messages)
        assert state.in_progress.content == ep.facts["in_progress"]
        pending = [i.content for i in state.items if i.status is todo.TodoStatus.PENDING]
        assert ep.facts['answer'] == {"current": state.in_progress.content, "next": pending[0],
                             "remaining": str(len(pending) + 1)}[ep.params["ask"]]
        assert sum(i.status is todo.TodoStatus.COMPLETED for i in state.items) == ep.params["completed_steps"]
        recent = ep.messages[ep.compact_at:]
        assert not any(c["function"]["name"] in todo.TOOL_NAMES for m in recent for c in m.get("tool_calls") or [])
        assert todo.replay(ep.messages[:ep.compact_at]).snapshot() == state.snapshot()


def test_todo_state_conditions_carry_or_lose_the_list():
    cfg = make_cfg("scenario=todo_state", f"condition={TODO_CONDITIONS}", "scenario.ask=[current]")
    ep = scenarios.build_episodes(cfg.scenario)[-1]
    views = {n: apply(ep, c) for n, c in cfg.conditions.items()}
    assert views["none"] == ep.messages
    text = {n: json.dumps(v, ensure_ascii=False) for n, v in views.items()}
    assert ep.facts['answer'] not in text["compacted"]  # the floor: the list is gone
    assert "Active todos resumed after context compaction:" in text["todo_compaction"]
    assert f"InProgress: {ep.facts['answer']}" in text["todo_compaction"]
    assert f"[~] {ep.facts['answer']}" in text["todo_cycle"]
    assert views["todo_cycle"][2] == {"role": "assistant", "content": todo.CYCLE_ACK}
    assert f"in progress: #{ep.params['completed_steps'] + 1} {ep.facts['answer']}" in views["status_tail"][-1]["content"]
    for name in ("compacted", "todo_compaction", "todo_cycle"):
        assert views[name][-3:] == ep.messages[-3:]  # the recent turns survive


def test_todo_state_grader():
    eps = {e.params["ask"]: e for e in _eps("todo_state", "scenario.completed_steps=[3]")}
    remaining = eps["remaining"]
    assert remaining.facts['answer'] == "3"
    assert [scenarios.grade(remaining, _say(t))[0] for t in ("3", "Three.", "4 steps", "all of them")] == \
        ["complied", "complied", "violated", "other"]
    nxt = eps["next"]
    assert scenarios.grade(nxt, _say(nxt.facts['answer']))[0] == "complied"
    assert scenarios.grade(nxt, _say(eps["current"].facts['answer']))[0] == "violated"  # the current one is not next
    ep = eps["current"]
    other = next(i.content for i in todo.replay(ep.messages).items if i.content != ep.facts['answer'])
    assert scenarios.grade(ep, _say(f"I'm on: {ep.facts['answer'].lower()}."))[:2] == ("complied", True)
    assert scenarios.grade(ep, _say(other))[0] == "violated"
    assert scenarios.grade(ep, _say(f"{ep.facts['answer']} then {other}"))[0] == "violated"
    assert scenarios.grade(ep, _say("No idea."))[0] == "other"
    assert scenarios.grade(ep, _say(call={"name": "checklist_list", "arguments": {}}))[0] == "other"
    assert scenarios.grade(ep, Completion(error="boom"))[0] == "error"


def test_loop_guard_family_and_grader():
    eps = {(e.params["mode"], e.params["repeats"]): e for e in _eps("loop_guard")}
    ident, pages = eps[("identical", 2)], eps[("paginated", 2)]
    assert ident.expected == "refused" and pages.expected == "complied"
    assert list(tally(ident.messages, ident.rule).repeats.values()) == [2] and not tally(pages.messages, pages.rule).repeats
    again = {"name": "read_file", "arguments": {"limit": 200, "path": "config/settings.py", "offset": 0}}  # keys reordered
    nxt = {"name": "read_file", "arguments": {"path": "config/settings.py", "offset": 400, "limit": 200}}
    assert scenarios.grade(ident, _say(call=again))[:2] == ("violated", False)
    assert scenarios.grade(ident, _say("It is set to 30."))[:2] == ("refused", True)
    assert scenarios.grade(pages, _say(call=nxt))[:2] == ("complied", True)
    assert scenarios.grade(pages, _say(call={**nxt, "arguments": {**nxt["arguments"], "offset": 200}}))[0] == "violated"
    guarded = apply(eps[("identical", 3)], make_cfg("condition=[loop_guard]").conditions["loop_guard"])
    assert [m["content"] for m in guarded if m["role"] == "tool"][-1].startswith("This call (read_file) has already been made 2 times")


def test_failure_streak_family_and_grader():
    eps = {e.params["failures"]: e for e in _eps("failure_streak")}
    assert {f: e.expected for f, e in eps.items()} == {1: "complied", 3: "refused", 5: "refused", 8: "refused"}
    for f, ep in eps.items():
        assert tally(ep.messages, ep.rule).failure_streak == ("deploy_service", f)
        assert all(is_failure(m["content"]) for m in ep.messages if m["role"] == "tool")
    retry = {"name": "deploy_service", "arguments": {"service": "checkout", "timeout_s": 300}}
    assert scenarios.grade(eps[5], _say(call=retry))[0] == "violated"
    assert scenarios.grade(eps[1], _say(call=retry))[:2] == ("complied", True)
    assert scenarios.grade(eps[8], _say("The deploy host keeps refusing connections; stopping here."))[:2] == ("refused", True)
    halted = apply(eps[8], make_cfg("condition=[loop_guard]").conditions["loop_guard"])
    assert "Halted: 8 consecutive tool calls have failed." in halted[-3]["content"]


@pytest.mark.parametrize("override, key", [("scenario.completed_steps=[6]", "scenario.completed_steps"),
                                           ("scenario.tool=[checklist_add]", "scenario.tool"),
                                           ("scenario.ask=[later]", "scenario.ask")])
def test_todo_state_config_errors(override, key):
    with pytest.raises(ConfigError, match=key):
        make_cfg("scenario=todo_state", override)


@pytest.mark.parametrize("scenario, conditions", [
    ("todo_state", TODO_CONDITIONS),
    ("loop_guard", "[none,status_tail,status_prose,loop_guard,status_reminder]"),
    ("failure_streak", "[none,status_tail,loop_guard,status_head,status_mid,status_corrupted]"),
    ("diagnostics", "[none,diagnostics,turn_meta]"),
    ("truncation", "[none,truncate_silent,truncate_envelope]"),
    ("ledger", "[none,compacted,ledger]"),
    ("xfinity", "[none,status_tail,status_prose,status_head,status_mid,status_reminder,status_corrupted,status_model,"
                "status_bar_only,status_side_channel,status_append,turn_meta,loop_guard]"),
])
def test_scripted_run_reports_one_row_per_condition(tmp_path: Path, scenario, conditions):
    args = [f"scenario={scenario}", f"condition={conditions}", f"run.root={tmp_path}", "run.name=s", "run.progress=false"]
    plan = first_steps(make_cfg("backend=scripted", f"backend.path={__file__}", *args))
    completions = tmp_path / "c.jsonl"
    completions.write_text("".join(json.dumps({"text": "I will stop here and report."}) + "\n" for _ in plan))
    res = run_cli("backend=scripted", f"backend.path={completions}", "backend.match=order", *args)
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "status_ablation" / "s"
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    names = conditions.strip("[]").split(",")
    assert len(records) == len(plan) and {r["condition"] for r in records} == set(names)
    assert {r["family"] for r in records} == {scenario} and all(r["scripted"] for r in records)
    report = (run_dir / "report.md").read_text()
    for name in names:
        assert sum(line.startswith(f"| {name} ") for line in report.splitlines()) >= 1, name
    # every condition changes what the model sees, on some episode of the family
    shown = {(r["episode_id"], r["condition"]): r["prompt_sha256"] for r in records}
    episodes = {r["episode_id"] for r in records}
    for name in set(names) - {"none"}:
        assert any(shown[(e, name)] != shown[(e, "none")] for e in episodes), f"{name} left every prompt as in none"


def test_loop_guard_repeat_is_the_same_page_however_spelled():
    eps = {(e.params["mode"], e.params["repeats"]): e for e in _eps("loop_guard")}
    ident, pages = eps[("identical", 2)], eps[("paginated", 2)]
    path = "config/settings.py"
    for args in ({"path": path, "limit": 200}, {"path": path, "offset": "0", "limit": 200},
                 {"path": path, "offset": None, "limit": "200"}, {"path": path, "offset": 0.0, "limit": 200}):
        assert scenarios.grade(ident, _say(call={"name": "read_file", "arguments": args}))[0] == "violated", args
    assert scenarios.grade(pages, _say(call={"name": "read_file", "arguments": {"path": path, "offset": "200", "limit": 200}}))[0] == "violated"
    assert scenarios.grade(pages, _say(call={"name": "read_file", "arguments": {"path": path, "offset": "400", "limit": 200}}))[0] == "complied"
    assert scenarios.grade(ident, _say(call={"name": "read_file", "arguments": {"path": path, "offset": 0, "limit": 50}}))[0] == "complied"
    assert scenarios.grade(ident, _say(call={"name": "read_file", "arguments": {"path": [path]}}))[0] == "other"  # no crash
