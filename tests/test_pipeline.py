"""Every condition preset crossed with the loop guard and <turn_meta>: in the final prompt (after the
writer places a model-written bar too), the marker of every mechanism switched on is present."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.context import ConditionConfig, view
from harness.context.bar import BarSource, Placement, Update, cadence, shows_now
from harness.context.history import History
from harness.context.loop_guard import LoopGuardConfig
from harness.context.status import Wrapper
from harness.context.turn_meta import TurnMetaConfig
from harness.errors import ConfigError
from harness.run import first_steps
from harness.flow.writer import write_bars
from harness.registry import FAMILIES
from harness.types import Completion
from tests.conftest import make_cfg

REPO = Path(__file__).resolve().parent.parent
PRESETS = sorted(p.stem for p in (REPO / "conf" / "condition").glob("*.yaml"))
WRITTEN = "<agent_status>written by the writer model</agent_status>"


def _repeated_calls_episode(ep):
    """The episode with one agent turn of three identical reads inserted before the final question:
    the loop guard blocks the third."""
    call = {"type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": "src/app.py"})}}
    calls = [{**call, "id": f"rep{i:06d}"} for i in range(3)]
    turn = [{"role": "assistant", "content": "", "tool_calls": calls}] + [
        {"role": "tool", "tool_call_id": c["id"], "name": "read_file", "content": "print('hi')"} for c in calls]
    assert ep.messages[-1]["role"] == "user"
    return replace(ep, messages=ep.messages[:-1] + turn + ep.messages[-1:], tags=ep.tags[:-1] + ["distractor"] * 4 + ep.tags[-1:])


class WriterStub:
    name = "stub"

    def generate(self, requests):
        return [Completion(text=WRITTEN, scripted=True) for _ in requests]


def _bars(messages):
    return [m for m in messages if "<agent_status" in (m.get("content") or "")]


# presets whose mechanism has nothing to act on in todo_state's episodes, and the key each refusal names
REFUSED_ON_TODO = {"diagnostics": "conditions.diagnostics.diagnostics", "status_at_limit": "status.cadence"}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("guard, meta", [(False, False), (True, False), (False, True), (True, True)])
def test_every_preset_crossed_with_guard_and_turn_meta(preset, guard, meta, monkeypatch):
    cfg = make_cfg("scenario=todo_state", "scenario.ask=[current]", f"condition=[{preset}]")
    # the two steps switched on or off over the preset's own settings
    ccfg = cfg.conditions[preset] = replace(cfg.conditions[preset], loop_guard=LoopGuardConfig() if guard else None,
                                            turn_meta=TurnMetaConfig() if meta else None)
    bar = ccfg.status
    family = FAMILIES.get("todo_state")
    monkeypatch.setitem(FAMILIES._entries, "todo_state",
                        replace(family, build=lambda scfg: [_repeated_calls_episode(e) for e in family.build(scfg)][:1]))
    if preset in REFUSED_ON_TODO:  # nothing to show on this family: refused when the run starts, in one line
        with pytest.raises(ConfigError, match=REFUSED_ON_TODO[preset]):
            first_steps(cfg)
        return
    sample = first_steps(cfg)[0]
    ep = sample.episode
    batch, written = write_bars([sample], lambda c: (WriterStub(), cfg.model))  # source=model: the writer's bar goes in
    messages = batch[0].request.messages
    text = json.dumps(messages)

    has_tools = any(m["role"] == "tool" for m in messages)
    blocked = "has already been made 2 times this turn" in text
    assert blocked == (guard and has_tools), "loop guard marker"
    first_user = next(m for m in messages if m["role"] == "user")
    assert first_user["content"].startswith("<turn_meta>") == meta, "turn_meta opens the first user message"
    assert all(not b["content"].startswith("<turn_meta>") for b in _bars(messages)), "a bar never gets the turn meta"

    bars = _bars(messages)
    if bar is None:
        assert not bars
    elif bar.source == BarSource.model:
        # the writer's block body, in the condition's tags (kv: on its own lines)
        assert written[sample.sample_id]["bar"] == bars[-1]["content"] == "<agent_status>\nwritten by the writer model\n</agent_status>"
    elif not shows_now(ep, bar):  # its cadence shows no bar at this turn end
        assert not bars or bar.update == Update.append
    else:
        assert bars and ("<system-reminder>" in bars[-1]["content"]) == (bar.wrapper == Wrapper.system_reminder)
        assert ('visibility="internal"' in bars[-1]["content"]) == bar.internal
        assert ("retries" in bars[-1]["content"]) == bar.side_channel
        if bar.update == Update.append:
            assert len(bars) == sum(cadence(ep, bar))
    if bars and bar.placement == Placement.head:
        assert messages[0]["role"] == "system" and bars == [messages[0]]
    elif bars and bar.placement == Placement.mid:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        assert messages[last_user - 1]["role"] == "system" and messages[last_user - 1] is bars[-1]
    elif bars:
        assert messages[-1] is bars[-1]

    if ccfg.history == History.bar_only:
        assert not has_tools and not any(m.get("tool_calls") for m in messages)
    if ccfg.history == History.compacted or ccfg.kind.startswith("todo_"):
        assert len(messages) < len(ep.messages) + len(bars)
    assert ("Active todos resumed after context compaction:" in text) == (ccfg.kind == "todo_compaction")
    assert ("## Cycle State (Auto-Preserved)" in text) == (ccfg.kind == "todo_cycle")
    if ccfg.kind == "none" and ccfg.history == History.full and not guard and not meta:
        assert messages == ep.messages  # the trajectory as is
    if guard and has_tools and ccfg.history == History.full and ccfg.kind in ("none", "status"):
        guarded = view(ep, ConditionConfig(loop_guard=LoopGuardConfig())).messages  # the guard alone
        assert [m for m in messages if m["role"] == "tool"] == [m for m in guarded if m["role"] == "tool"]


@pytest.mark.parametrize("step, on, settings", [("loop_guard", LoopGuardConfig(block_at=4), ["block_at=4"]),
                                               ("turn_meta", TurnMetaConfig(last_only=True), ["last_only=true"])])
def test_a_step_is_switched_on_in_any_preset_from_the_command_line(step, on, settings):
    """The README's `conditions.status_tail.loop_guard.enabled=true`: a mechanism the preset leaves
    off, switched on with its settings by overrides; settings on a step left off are refused."""
    prefix = f"conditions.status_tail.{step}"
    ccfg = make_cfg("condition=[status_tail]", f"{prefix}.enabled=true",
                    *(f"{prefix}.{s}" for s in settings)).conditions["status_tail"]
    assert getattr(ccfg, step) == on and ccfg.status is not None
    assert getattr(make_cfg("condition=[status_tail]").conditions["status_tail"], step) is None
    with pytest.raises(ConfigError, match=f"condition.{step}: has settings but is off: add {step}.enabled=true"):
        make_cfg("condition=[status_tail]", *(f"{prefix}.{s}" for s in settings))

def test_a_sample_whose_bar_was_not_written_is_an_error_and_never_answered():
    from harness.flow.rounds import generate

    plan = first_steps(make_cfg("condition=[status_model]", "scenario.calls_made=[2,3]", "scenario.placement=[early]",
                              "scenario.episodes_per_cell=1"))
    assert len(plan) == 2

    class Writer:  # fails the first bar, writes the second
        def generate(self, requests):
            return [Completion(error="writer down", scripted=True), Completion(text=WRITTEN, scripted=True)]

    class Main:
        name = "main"
        asked: list = []

        def generate(self, requests):
            self.asked.extend(requests)
            return [Completion(text="Done.") for _ in requests]

    cfg = make_cfg()
    batch, written = write_bars(plan, lambda c: (Writer(), cfg.model))
    moved: list[float] = []
    main = Main()
    completions = generate(main, batch, written, moved.append)
    assert [r.sample_id for r in main.asked] == [plan[1].sample_id]  # the failed one was not asked
    assert completions[0].error == "writer: writer down" and completions[0].scripted
    assert completions[1].text == "Done." and completions[1].error is None
    assert sum(moved) == 2  # the progress bar counts both
