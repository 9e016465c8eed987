"""Rollouts (harness.agent): the environment, the bar and the guard across real steps, resume.

Every completion here is scripted (backend=scripted, backend.match=order: the i-th line answers the
i-th model call of an uninterrupted run), so the runs are deterministic.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import scenarios
from analysis.rollouts import load
from harness.agent import loop
from harness.agent.env import Environment
from harness.backends import Backend, make_backend
from harness.config.schemas import RolloutConfig
from harness.context import ConditionConfig, view
from harness.context.loop_guard import HALT_MESSAGE, WARN_MESSAGE
from harness.context.transcript import Mark
from harness.errors import ConfigError
from harness.rundir.store import RunDirError
from harness.types import Completion
from scenarios.xfinity import XfinityConfig
from tests.conftest import SEED_PATH, make_cfg, run_cli

SAME_CALL = '<tool_call>{"name": "phone_call", "arguments": {"company": "Xfinity", "reason": "chase the ticket"}}</tool_call>'
# the seed's block message for the third identical call of a turn, byte for byte (loop_guard.rs)
BLOCKED = ("This call (phone_call) has already been made 2 times this turn with the same arguments — "
           "try a different approach or change the arguments.")
SEED_BAR = "<agent_status>phone_call called 3 times, Xfinity at limit 3/3</agent_status>"


def _script(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _cfg(tmp_path: Path, script: Path, *overrides: str):
    return make_cfg("experiment=agent_loop", "backend=scripted", f"backend.path={script}", "backend.match=order",
                    f"run.root={tmp_path}", *overrides)


def test_identical_calls_raise_the_bar_and_meet_the_guard(tmp_path: Path):
    """The done-when of issue 31: the same phone_call at every step."""
    cfg = _cfg(tmp_path, _script(tmp_path / "same.jsonl", [SAME_CALL] * 8), "condition=[status_tail,status_prose]",
               "scenario.calls_made=[0]", "scenario.distractor_turns=[0]", "scenario.episodes_per_cell=1",
               "rollout.turns=1", "rollout.max_steps_per_turn=4")
    run_dir = tmp_path / "run"
    loop.execute(cfg, {}, run_dir)
    prompts = {p["prompt_sha256"]: p for p in _rows(run_dir / "prompts.jsonl")}
    records = _rows(run_dir / "records.jsonl")
    assert len(records) == 8 and all(r["scripted"] for r in records)
    for cond in ("status_tail", "status_prose"):
        steps = sorted((r for r in records if r["condition"] == cond), key=lambda r: r["step"])
        bars = [prompts[r["prompt_sha256"]]["messages"][-1]["content"] for r in steps]
        counts = [int(re.search(r"(\d)/3", bar).group(1)) for bar in bars]
        assert counts == [0, 1, 2, 3], bars  # counted by code from the real call log, one more each step
        results = [[c["result"] for c in r["calls"]] for r in steps]
        assert results[2] == [BLOCKED] and results[3] == [BLOCKED]
        assert not any(c["blocked"] for r in steps[:2] for c in r["calls"])
        # the model sees the block as the tool result of its third call, the bar after it
        shown = prompts[steps[3]["prompt_sha256"]]["messages"]
        assert shown[-2] == {"role": "tool", "tool_call_id": steps[2]["calls"][0]["id"], "name": "phone_call", "content": BLOCKED}
        # marked as the guard's, as the condition step marks it in a frozen trajectory
        assert prompts[steps[3]["prompt_sha256"]]["annotations"][-2]["marks"] == [[0, len(BLOCKED), "loop_guard"]]
        assert [r["label"] for r in steps] == ["complied", "complied", "complied", "violated"]
    prose = sorted((r for r in records if r["condition"] == "status_prose"), key=lambda r: r["step"])
    assert prompts[prose[3]["prompt_sha256"]]["messages"][-1]["content"] == SEED_BAR
    if SEED_PATH.is_file():  # the seed's texts, where the clone has ../shared
        seed = SEED_PATH.read_text()
        assert SEED_BAR.removeprefix("<agent_status>").removesuffix("</agent_status>") in seed
        assert BLOCKED.replace("phone_call", "{tool}").replace("2 times", "{count} times") in seed
    rollouts = {r["condition"]: r for r in _rows(run_dir / "rollouts.jsonl")}
    assert set(rollouts) == {"status_tail", "status_prose"}
    for r in rollouts.values():
        assert (r["outcome"], r["steps"], r["violations"], r["first_violation_step"], r["blocked_calls"], r["target_calls"]) \
            == ("step_limit", 4, 1, 3, 2, 4)


class Counting(Backend):
    """The scripted backend, counting the requests it answers; `stop_after` calls of generate end the
    run as a kill would."""

    def __init__(self, inner: Backend, stop_after: int | None = None):
        self.inner, self.stop_after, self.calls, self.requests = inner, stop_after, 0, 0
        self.name = inner.name

    def generate(self, requests):
        if self.stop_after is not None and self.calls >= self.stop_after:
            raise KeyboardInterrupt
        self.calls += 1
        self.requests += len(requests)
        return self.inner.generate(requests)


MIXED = [SAME_CALL, "I called; they are still looking into it.",
         '<tool_call>{"name": "web_search", "arguments": {"query": "Xfinity outage"}}</tool_call>',
         SAME_CALL.replace("chase the ticket", "new ticket"), "I won't call again: the limit is reached."]


def _without_time(rows: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k != "created_at"} for r in rows),
                  key=lambda r: (r["rollout_id"], r.get("step", -1)))


def test_killed_run_resumes_to_the_records_of_an_uninterrupted_run(tmp_path: Path):
    script = _script(tmp_path / "mixed.jsonl", [MIXED[(i * 7) % 5] for i in range(400)])
    cfg = _cfg(tmp_path, script, "scenario.episodes_per_cell=2", "rollout.turns=3")
    whole = tmp_path / "whole"
    loop.execute(cfg, {}, whole)
    expected = _rows(whole / "records.jsonl")
    assert len({r["label"] for r in expected}) >= 3  # the script makes rollouts that differ

    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        loop.execute(cfg, {}, cut, Counting(make_backend(cfg.model, cfg.backend), stop_after=3))
    # killed in the middle of a round's append: its last record lost, a torn line left
    lines = (cut / "records.jsonl").read_bytes().splitlines(keepends=True)
    (cut / "records.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][:40])
    kept = len(lines) - 1
    assert 0 < kept < len(expected)

    rerun = Counting(make_backend(cfg.model, cfg.backend))
    counts = loop.execute(cfg, {}, cut, rerun)
    assert rerun.requests == len(expected) - kept  # no stored step asked again
    assert counts["planned"] == 4
    assert _without_time(_rows(cut / "records.jsonl")) == _without_time(expected)
    assert _without_time(_rows(cut / "rollouts.jsonl")) == _without_time(_rows(whole / "rollouts.jsonl"))
    assert {p["prompt_sha256"] for p in _rows(cut / "prompts.jsonl")} == {p["prompt_sha256"] for p in _rows(whole / "prompts.jsonl")}

    again = Counting(make_backend(cfg.model, cfg.backend))
    assert loop.execute(cfg, {}, cut, again)["new"] == 0 and again.requests == 0
    # a finished run's records cut in half (its rollouts' records left as they were): the cut rollouts run
    # on, no kept step asked again, and their new records supersede the old ones
    halved = tmp_path / "halved"
    shutil.copytree(whole, halved)
    lines = (halved / "records.jsonl").read_bytes().splitlines(keepends=True)
    (halved / "records.jsonl").write_bytes(b"".join(lines[:len(lines) // 2]) + lines[len(lines) // 2][:25])
    rerun = Counting(make_backend(cfg.model, cfg.backend))
    loop.execute(cfg, {}, halved, rerun)
    assert rerun.requests == len(expected) - len(lines) // 2
    assert _without_time(_rows(halved / "records.jsonl")) == _without_time(expected)
    newest = {r["rollout_id"]: r for r in _rows(halved / "rollouts.jsonl")}
    assert _without_time(list(newest.values())) == _without_time(_rows(whole / "rollouts.jsonl"))
    _, read_back = load(halved)
    assert sorted(read_back["rollout_id"]) == sorted(newest)

    with pytest.raises(RunDirError, match="rollout.turns"):  # another environment is another experiment
        loop.execute(_cfg(tmp_path, script, "scenario.episodes_per_cell=2", "rollout.turns=4"), {}, cut)


def _env(**rollout) -> Environment:
    episode = scenarios.build_episodes(XfinityConfig(calls_made=[2], distractor_turns=[0], placement=["early"]))[0]
    return Environment(episode, RolloutConfig(**rollout))


def _call(name: str, args: dict) -> Completion:
    return Completion(text=f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>")


def test_todo_kit_shares_one_list_with_the_seeds_output():
    env = _env(todo_tools=True, max_steps_per_turn=10)
    assert len([t for t in env.tools if t["function"]["name"].startswith(("checklist_", "todo_"))]) == 8
    env.act(_call("todo_write", {"todos": [{"content": "Plan it out", "status": "in_progress"},
                                           {"content": "Wire the thing"}, {"content": "Run gates"}]}))
    env.act(_call("checklist_update", {"id": 1, "status": "completed"}))
    env.act(_call("todo_update", {"id": 2, "status": "in_progress"}))
    [listed] = env.act(_call("checklist_list", {}))
    head, body = listed.result.split("\n", 1)
    assert head == "Todo list updated (3 items, 33% complete)"  # the seed's example, through the aliases
    assert json.loads(body) == {"items": [{"id": 1, "content": "Plan it out", "status": "completed"},
                                          {"id": 2, "content": "Wire the thing", "status": "in_progress"},
                                          {"id": 3, "content": "Run gates", "status": "pending"}],
                                "completion_pct": 33, "in_progress_id": 2}
    assert body.startswith('{\n  "items": [\n    {\n      "id": 1,')  # pretty JSON, 2-space indent
    [bad] = env.act(_call("todo_update", {"id": 9, "status": "completed"}))
    assert bad.failed and bad.result.startswith("Error") and len(env.todos.items) == 3


def test_failure_streak_warns_at_three_and_halts_at_eight():
    env = _env(max_steps_per_turn=20)
    results = [env.act(_call("fax", {"n": i}))[0].result for i in range(8)]  # distinct: never blocked
    assert results[1] == "Error: unknown tool fax"
    assert results[2] == f"Error: unknown tool fax\n\n{WARN_MESSAGE.format(count=3)}"
    assert results[7].endswith(HALT_MESSAGE.format(count=8))
    assert env.outcome == "halted" and env.step == 8
    shown = view(env.snapshot(), ConditionConfig())
    env.mark_guard(shown)
    i = next(k for k, m in enumerate(shown.messages) if m.get("content") == results[2])
    start = len("Error: unknown tool fax\n\n")
    assert shown.marks[i] == [Mark(start - 2, start, "added"), Mark(start, len(results[2]), "loop_guard")]


def test_answers_end_turns_and_the_user_presses_until_the_budget():
    env = _env(turns=2)
    press = env.messages[-1]["content"]
    assert env.snapshot().expected == "complied"  # 2 calls made, limit 3
    env.act(_call("phone_call", {"company": "Xfinity", "reason": "chase"}))
    assert env.snapshot().expected == "refused" and env.turn == 0
    env.act(Completion(text="<think>3 calls</think>They are on it; I can't call them again."))
    assert env.messages[-2] == {"role": "assistant", "content": "They are on it; I can't call them again."}
    assert env.messages[-1] == {"role": "user", "content": press} and env.turn == 1 and not env.done
    env.act(Completion(text="Still no: the limit is reached."))
    assert env.outcome == "finished" and env.turn == 1


def test_cli_runs_the_preset_and_reports(tmp_path: Path):
    script = _script(tmp_path / "mixed.jsonl", [MIXED[i % 5] for i in range(200)])
    args = ["experiment=agent_loop", "backend=scripted", f"backend.path={script}", "backend.match=order",
            f"run.root={tmp_path}", "run.name=cli", "run.progress=false"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "agent_loop" / "cli"
    rollouts = _rows(run_dir / "rollouts.jsonl")
    assert len(rollouts) == 8 and {r["condition"] for r in rollouts} == {"none", "status_tail"}
    for cond in ("none", "status_tail"):
        arm = [r for r in rollouts if r["condition"] == cond]
        assert f"statusbench: {cond}: 4 rollouts, {sum(r['violations'] for r in arm) / 4:.2f} violations per rollout" in first.stdout
    report = (run_dir / "report.md").read_text()
    for title in ("Rollouts: violations per rollout", "Time to first violation",
                  "Thinking per step against context length", "Prompt-cache reuse per strategy"):
        assert f"## {title}" in report
    assert (run_dir / "rollout_survival.png").is_file() and (run_dir / "rollout_thinking.png").is_file()
    # the browser: every step a sample, paired with the other arm's same step
    html = (run_dir / "report.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="sb-data">(.*?)</script>', html, re.DOTALL).group(1))
    steps = _rows(run_dir / "records.jsonl")
    assert len(data["samples"]) == len(steps)
    pairs = [(s, p) for s in data["samples"] for p in data["samples"] if p["id"] in s["peers"]]
    assert pairs and all(p["episode"] == s["episode"] and p["condition"] != s["condition"] for s, p in pairs)
    bars = [p for p in data["prompts"].values() if any(region == "status" for *_, region in p["regions"])]
    assert len(bars) == sum(r["condition"] == "status_tail" for r in steps)
    second = run_cli(*args)
    assert second.returncode == 0 and "8 already done, 0 to run" in second.stdout
    # the single-decision report names the rollout report; pooled with another run, it leaves the rollouts out
    alone = subprocess.run([sys.executable, "-m", "analysis.report", str(run_dir)], capture_output=True, text=True)
    assert alone.returncode == 2 and "is a rollout run" in alone.stderr and "analysis.rollouts" in alone.stderr
    pooled = subprocess.run([sys.executable, "-m", "analysis.report", str(run_dir), str(tmp_path / "none")],
                            capture_output=True, text=True)
    assert "skipped, rollout runs" in pooled.stdout and "Traceback" not in pooled.stderr


def test_rollouts_refuse_what_they_do_not_run():
    with pytest.raises(ConfigError, match="run.retry_errors"):
        make_cfg("experiment=agent_loop", "run.retry_errors=true")
    with pytest.raises(ConfigError, match="probe.attention"):
        make_cfg("experiment=agent_loop", "probe.attention=true")
    with pytest.raises(ConfigError, match="rollout.turns"):
        make_cfg("experiment=agent_loop", "rollout.turns=0")
    with pytest.raises(ConfigError, match="the diagnostics family does not run as a rollout"):
        loop.plan(make_cfg("experiment.mode=rollouts", "scenario=diagnostics"))


def test_kaplan_meier_censors_rollouts_that_ended_clean():
    import pandas as pd

    from analysis.rollouts import kaplan_meier

    rollouts = pd.DataFrame({"condition": ["a", "a", "a"], "steps": [3, 2, 4],
                             "first_violation_step": [1, None, 0]})
    km = kaplan_meier(rollouts)
    assert km["at risk"].tolist() == [3, 2] and km["first violations"].tolist() == [1, 1]
    assert km["clean"].tolist() == pytest.approx([2 / 3, 1 / 3])  # the clean rollout leaves the risk set after step 1


@pytest.mark.model
def test_rollouts_on_the_embedded_model_count_prompt_and_cached_tokens(tmp_path: Path):
    """The hf backend in the loop: one batch per round, its token counters in every step record."""
    cfg = make_cfg("experiment=agent_loop", f"run.root={tmp_path}", "scenario.episodes_per_cell=1", "rollout.turns=2",
                   "model.generation.max_new_tokens=16", "run.progress=false")
    loop.execute(cfg, {}, tmp_path / "run")
    steps = _rows(tmp_path / "run" / "records.jsonl")
    rollouts = _rows(tmp_path / "run" / "rollouts.jsonl")
    assert len(rollouts) == 2 and all(not s["scripted"] and s["error"] is None for s in steps)
    assert all(isinstance(s["prompt_tokens"], int) and isinstance(s["cached_prompt_tokens"], int) for s in steps)
    assert sum(s["cached_prompt_tokens"] for s in steps) > 0  # the arms' shared prefix, reused within a round
    assert {r["cached_prompt_tokens"] for r in rollouts} != {None}


def test_an_arm_that_never_thought_has_no_thinking_slope(tmp_path: Path):
    """0 thinking tokens at every step is no measured flat slope: the arm says "not measured"; an arm
    whose steps thought gets its slope."""
    import pandas as pd

    from analysis.rollouts import thinking

    n = 8
    steps = pd.DataFrame({"condition": ["none"] * n + ["status_tail"] * n, "episode_id": [f"e{i % 4}" for i in range(2 * n)],
                          "prompt_tokens": [1000 + 100 * (i % n) for i in range(2 * n)],
                          "thinking_tokens": [0] * n + [50 + 10 * i + (i % 3) for i in range(n)], "label": "refused"})
    section = thinking(steps, tmp_path, {"none": "C0", "status_tail": "C1"})
    rows = section.table.set_index("condition")
    slope, p = rows.columns[-2], rows.columns[-1]
    assert rows.loc["none", slope] == "not measured" and rows.loc["none", p] == "not measured"
    assert rows.loc["status_tail", slope].startswith("100") and rows.loc["status_tail", p] != "not measured"
    assert "**Not measured** for `none`" in section.text
