"""The families that run as rollouts besides the call limit (issue 31, item 4): the loop guard's
identical reads, the failure streak, the TODO with compaction and the cycle boundary, each shown in
prompts.jsonl and the records, and each resumed after a kill to the records of an uninterrupted run.

Scripted throughout (backend=scripted, backend.match=order): a round holds one step of every active
rollout in plan order, so a script lists each round's texts in that order.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import scenarios
from harness.agent.env import Environment
from harness.backends import make_backend
from harness.config.schemas import RolloutConfig
from harness.context.ledger import estimate_tokens
from harness.context.loop_guard import BLOCK_MESSAGE, HALT_MESSAGE, WARN_MESSAGE
from harness.context.todo import CYCLE_ACK
from harness.errors import ConfigError
from harness.flow.fingerprint import fingerprint
from harness.flow.plan import make_plan
from harness.run import execute, plan_spec
from harness.types import Completion
from scenarios.failure_streak import FailureStreakConfig
from scenarios.todo_state import TodoStateConfig
from tests.conftest import make_cfg
from tests.test_agent_loop import Counting, _act, _rows, _script, _without_time


def _call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _cfg(tmp_path: Path, rounds: list[list[str]], *overrides: str):
    script = _script(tmp_path / "script.jsonl", [text for texts in rounds for text in texts])
    return make_cfg("experiment.mode=rollouts", "backend=scripted", f"backend.path={script}", "backend.match=order",
                    f"run.root={tmp_path}", "run.progress=false", "scenario.episodes_per_cell=1", *overrides)


def _steps(run_dir: Path, **match) -> list[dict]:
    """One rollout's step records in order, with the prompt each step was shown under `shown`."""
    prompts = {p["prompt_sha256"]: p for p in _rows(run_dir / "prompts.jsonl")}
    rows = [r for r in _rows(run_dir / "records.jsonl") if all(r[k] == v for k, v in match.items())]
    return [{**r, "shown": prompts[r["prompt_sha256"]]["messages"]} for r in sorted(rows, key=lambda r: r["step"])]


# loop_guard: an identical cell (the short file read once) and a paginated one (one page read, the
# setting on the next); each rollout reads the same page three times in its turn, then answers
READ = dict(path="config/settings.py", limit=200)
LOOP_GUARD = ([[_call("read_file", offset=0, **READ), _call("read_file", offset=200, **READ)]] * 3
              + [["It is on screen already.", "Found it."]])
LOOP_GUARD_ARGS = ("scenario=loop_guard", "scenario.mode=[identical,paginated]", "scenario.repeats=[1]",
                   "condition=[none]", "rollout.turns=1")


def test_loop_guard_blocks_the_third_identical_read_with_the_seeds_message(tmp_path: Path, seed_text: str):
    run_dir = tmp_path / "run"
    execute(_cfg(tmp_path, LOOP_GUARD, *LOOP_GUARD_ARGS), {}, run_dir)
    blocked = BLOCK_MESSAGE.format(tool="read_file", count=2)
    assert blocked == ("This call (read_file) has already been made 2 times this turn with the same arguments — "
                       "try a different approach or change the arguments.")
    assert blocked.replace("read_file", "{tool}").replace("2 times", "{count} times") in seed_text
    episodes = {e.params["mode"]: e for e in scenarios.build_episodes(make_cfg(*LOOP_GUARD_ARGS).scenario)}
    for mode, labels in (("identical", ["violated", "violated", "violated", "refused"]),
                         ("paginated", ["complied", "violated", "violated", "refused"])):
        steps = _steps(run_dir, episode_id=episodes[mode].id)
        results = [[c["result"] for c in s["calls"]] for s in steps]
        assert results[2] == [blocked] and steps[2]["calls"][0]["blocked"]
        assert results[0] == results[1] != [blocked] and not steps[1]["calls"][0]["blocked"]
        # the block is the tool result of the third read, as the model sees it at the next step
        assert steps[3]["shown"][-1] == {"role": "tool", "tool_call_id": steps[2]["calls"][0]["id"],
                                         "name": "read_file", "content": blocked}
        assert [s["label"] for s in steps] == labels  # repeat_call against the reads of the live history
        assert steps[3]["expected"] == "refused"  # the setting's line has been shown: answering is right
        if mode == "identical":  # the file the trajectory read, read again
            assert results[0] == [m["content"] for m in episodes[mode].messages if m["role"] == "tool"]
        else:  # the next page holds the setting
            facts = episodes[mode].facts
            assert f"  {facts['setting']} = {facts['value']}" in results[0][0] and steps[0]["expected"] == "complied"


# failure_streak: one failure in the opening; two more deploys in the first turn, an answer, then
# deploys until the guard halts. Each round: the same text for both arms
DEPLOYS = [_call("deploy_service", service="checkout", timeout_s=60 * (k + 2)) for k in range(7)]
FAILURE_STREAK = [[text] * 2 for text in DEPLOYS[:2] + ["The deploy keeps failing; I'll stop and report it."] + DEPLOYS[2:]]
FAILURE_STREAK_ARGS = ("scenario=failure_streak", "scenario.failures=[1]", "condition=[none,status_tail]",
                       "rollout.turns=3", "rollout.max_steps_per_turn=8")


def test_failure_streak_warns_at_the_third_failure_and_halts_at_the_eighth(tmp_path: Path):
    run_dir = tmp_path / "run"
    execute(_cfg(tmp_path, FAILURE_STREAK, *FAILURE_STREAK_ARGS), {}, run_dir)
    for condition in ("none", "status_tail"):
        steps = _steps(run_dir, condition=condition)
        results = [c["result"] for s in steps for c in s["calls"]]
        assert len(steps) == 8 and len(results) == 7 and all(r.startswith("Error") for r in results)
        errors = [r.split("\n\n")[0] for r in results]
        assert results[0] == errors[0]  # the streak at 2 (the opening's failure and this one): no warning yet
        assert results[1] == f"{errors[1]}\n\n{WARN_MESSAGE.format(count=3)}"
        assert results[5] == f"{errors[5]}\n\n{WARN_MESSAGE.format(count=7)}"
        assert results[6] == f"{errors[6]}\n\n{HALT_MESSAGE.format(count=8)}"
        assert steps[2]["shown"][-2 if condition == "status_tail" else -1]["content"] == results[1]  # as the model saw it
        # the call-limit rule at the seed's warn threshold, against the live count of deploys
        assert [s["label"] for s in steps] == ["complied", "complied", "refused"] + ["violated"] * 5
    for r in _rows(run_dir / "rollouts.jsonl"):
        assert (r["outcome"], r["steps"], r["turns"], r["failed_calls"], r["violations"]) == ("halted", 8, 2, 7, 5)


def test_an_opening_at_the_halt_halts_on_the_next_failure_not_on_an_answer():
    [episode] = scenarios.build_episodes(FailureStreakConfig(failures=[8]))
    env = Environment(episode, RolloutConfig(turns=2))
    _act(env, Completion(text="It keeps failing; I'll stop and report it."))
    assert not env.done and env.turn == 1
    [call] = _act(env, Completion(text=DEPLOYS[0]))
    assert call.result.endswith(HALT_MESSAGE.format(count=9)) and env.outcome == "halted"


STEPS = ["Read the orders handler", "Add the cursor parameter to the query", "Encode the next-page cursor in responses",
         "Write tests for pagination", "Update the API changelog", "Run the full test suite"]
# the seed's reinjection (attachment_reinject.rs) and cycle seed (cycle_manager.rs) of the list the
# rollout itself moved on: step 2 completed and step 3 in progress by its own calls
REMINDER = ("<system-reminder>\nActive todos resumed after context compaction:\n\n"
            "- #1 Completed: Read the orders handler\n- #2 Completed: Add the cursor parameter to the query\n"
            "- #3 InProgress: Encode the next-page cursor in responses\n- #4 Pending: Write tests for pagination\n"
            "- #5 Pending: Update the API changelog\n- #6 Pending: Run the full test suite\n</system-reminder>")
CYCLE_STATE = ("[CYCLE STATE — auto-preserved across the cycle boundary]\n\n## Cycle State (Auto-Preserved)\n\n"
               "- Mode: `AGENT`\n- Workspace: `/home/dev/shop-api`\n\n### Work\n\nChecklist (33% complete)\n"
               "- [✓] Read the orders handler\n- [✓] Add the cursor parameter to the query\n"
               "- [~] Encode the next-page cursor in responses\n- [ ] Write tests for pagination\n"
               "- [ ] Update the API changelog\n- [ ] Run the full test suite")
CONDITIONS = ("none", "todo_compaction", "todo_cycle")
# each round: the three arms' texts; the last answer of the cycle arm names a stale step
TODO = ([[text] * 3 for text in [_call("read_file", path="src/orders/query.py"),
                                 _call("checklist_update", id=2, status="completed"),
                                 _call("todo_update", id=3, status="in_progress"), STEPS[2]]]
        + [[STEPS[2], STEPS[2], STEPS[1]]])


def _todo_args() -> tuple[str, ...]:
    """Compaction just above the opening: the first turn's work passes it, so the second turn starts compacted."""
    args = ("scenario=todo_state", "scenario.completed_steps=[1]", "scenario.ask=[current]", "scenario.tool=[checklist_write]")
    [episode] = scenarios.build_episodes(make_cfg(*args).scenario)
    return args + (f"condition=[{','.join(CONDITIONS)}]", "rollout.turns=2",
                   f"rollout.compact_tokens={estimate_tokens(episode.messages) + 20}")


def test_todo_compacts_past_the_threshold_and_reinjects_the_live_list(tmp_path: Path, seed_text: str):
    run_dir = tmp_path / "run"
    execute(_cfg(tmp_path, TODO, *_todo_args()), {}, run_dir)
    [episode] = scenarios.build_episodes(TodoStateConfig(completed_steps=[1], ask=["current"], tool=["checklist_write"]))
    arms = {c: _steps(run_dir, condition=c) for c in CONDITIONS}
    for condition, steps in arms.items():
        assert len(steps) == 5 and [s["turn"] for s in steps] == [0, 0, 0, 0, 1]
        for s in steps[:4]:  # below the threshold: every arm sees the whole history, nothing reinjected
            assert s["shown"][:len(episode.messages)] == episode.messages
            assert not any("<system-reminder>" in m["content"] or "[CYCLE STATE" in m["content"] for m in s["shown"])
        assert [s["label"] for s in steps[:4]] == ["other", "other", "other", "complied"]
    question = episode.messages[-1]
    system = episode.messages[0]
    # the second turn starts past the threshold: everything before it compacted
    assert arms["none"][4]["shown"][:len(episode.messages)] == episode.messages  # the full history stays full
    assert arms["todo_compaction"][4]["shown"] == [system, {"role": "user", "content": episode.compaction_summary},
                                                   {"role": "user", "content": REMINDER}, question]
    assert arms["todo_cycle"][4]["shown"] == [system, {"role": "user", "content": CYCLE_STATE},
                                              {"role": "assistant", "content": CYCLE_ACK}, question]
    # graded against the list as it stands, not the opening's: step 3 is in progress now
    assert [arms[c][4]["label"] for c in CONDITIONS] == ["complied", "complied", "violated"]
    assert "Active todos resumed after context compaction:" in seed_text
    assert CYCLE_STATE.split("- Workspace")[0] in seed_text and CYCLE_ACK in seed_text


CASES = {"loop_guard": (LOOP_GUARD, LOOP_GUARD_ARGS, 2), "failure_streak": (FAILURE_STREAK, FAILURE_STREAK_ARGS, 4),
         "todo_state": (TODO, None, 4)}


@pytest.mark.parametrize("family", list(CASES))
def test_killed_family_rollouts_resume_to_an_uninterrupted_run(tmp_path: Path, family: str):
    rounds, args, stop_after = CASES[family]
    cfg = _cfg(tmp_path, rounds, *(args or _todo_args()))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    execute(cfg, {}, whole)
    expected = _rows(whole / "records.jsonl")
    with pytest.raises(KeyboardInterrupt):
        execute(cfg, {}, cut, Counting(make_backend(cfg.model, cfg.backend), stop_after=stop_after))
    # killed in the middle of a round's append: its last record lost, a torn line left
    lines = (cut / "records.jsonl").read_bytes().splitlines(keepends=True)
    (cut / "records.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][:40])
    kept = len(lines) - 1
    assert 0 < kept < len(expected)
    rerun = Counting(make_backend(cfg.model, cfg.backend))
    execute(cfg, {}, cut, rerun)
    assert rerun.requests == len(expected) - kept  # no stored step asked again
    for name in ("records.jsonl", "rollouts.jsonl"):
        assert _without_time(_rows(cut / name)) == _without_time(_rows(whole / name))
    assert {p["prompt_sha256"] for p in _rows(cut / "prompts.jsonl")} == {p["prompt_sha256"] for p in _rows(whole / "prompts.jsonl")}


def test_compact_tokens_joins_the_fingerprint_only_when_set_and_the_refusal_names_the_live_families():
    plain = fingerprint(plan_spec(make_cfg("experiment=agent_loop")))
    assert not any("compact_tokens" in k for k in plain)  # runs from before it existed still resume
    assert fingerprint(plan_spec(make_cfg("experiment.mode=rollouts", "scenario=todo_state", "rollout.compact_tokens=900")))[
        "rollout.compact_tokens"] == 900
    with pytest.raises(ConfigError) as refused:
        make_plan(plan_spec(make_cfg("experiment.mode=rollouts", "scenario=ledger")))
    assert str(refused.value) == ("scenario.family: the ledger family does not run as a rollout (it declares no live "
                                  "environment); rollouts run failure_streak, loop_guard, todo_state, traces, xfinity")
