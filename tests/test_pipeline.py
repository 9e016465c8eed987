"""Every condition preset crossed with the loop guard and <turn_meta>: in the final prompt (after the
writer places a model-written bar too), the marker of every mechanism switched on is present."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.context import turn_ends
from harness.context.loop_guard import guard_trajectory
from harness.flow.plan import make_plan
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


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("guard, meta", [(False, False), (True, False), (False, True), (True, True)])
def test_every_preset_crossed_with_guard_and_turn_meta(preset, guard, meta, monkeypatch):
    cfg = make_cfg("scenario=todo_state", "scenario.ask=[current]", f"condition=[{preset}]",
                   f"conditions.{preset}.loop_guard={str(guard).lower()}", f"conditions.{preset}.turn_meta={str(meta).lower()}")
    ccfg = cfg.conditions[preset]
    family = FAMILIES.get("todo_state")
    monkeypatch.setitem(FAMILIES._load(), "todo_state",
                        replace(family, build=lambda scfg: [_repeated_calls_episode(e) for e in family.build(scfg)][:1]))
    sample = make_plan(cfg)[0]
    ep = sample.episode
    written = write_bars([sample], lambda c: (WriterStub(), cfg.model))  # source=model: the writer's bar goes in
    messages = sample.request.messages
    text = json.dumps(messages)

    has_tools = any(m["role"] == "tool" for m in messages)
    blocked = "has already been made 2 times this turn" in text
    assert blocked == (guard and has_tools), "loop guard marker"
    first_user = next(m for m in messages if m["role"] == "user")
    assert first_user["content"].startswith("<turn_meta>") == meta, "turn_meta opens the first user message"
    assert all(not b["content"].startswith("<turn_meta>") for b in _bars(messages)), "a bar never gets the turn meta"

    bars = _bars(messages)
    if ccfg.kind != "status" or ccfg.source == "none":
        assert not bars
    elif ccfg.source == "model":
        # the writer's block body, in the condition's tags (kv: on its own lines)
        assert written[sample.sample_id]["bar"] == bars[-1]["content"] == "<agent_status>\nwritten by the writer model\n</agent_status>"
    else:
        assert bars and ("<system-reminder>" in bars[-1]["content"]) == (ccfg.wrapper == "system_reminder")
        assert ('visibility="internal"' in bars[-1]["content"]) == ccfg.internal
        assert ("retries" in bars[-1]["content"]) == ccfg.side_channel
        if ccfg.update == "append":
            assert len(bars) == len(turn_ends(ep.messages))
    if bars and ccfg.placement == "head":
        assert messages[0]["role"] == "system" and bars == [messages[0]]
    elif bars and ccfg.placement == "mid":
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        assert messages[last_user - 1]["role"] == "system" and messages[last_user - 1] is bars[-1]
    elif bars:
        assert messages[-1] is bars[-1]

    if ccfg.history == "bar_only":
        assert not has_tools and not any(m.get("tool_calls") for m in messages)
    if ccfg.history == "compacted" or ccfg.kind.startswith("todo_"):
        assert len(messages) < len(ep.messages) + len(bars)
    assert ("Active todos resumed after context compaction:" in text) == (ccfg.kind == "todo_compaction")
    assert ("## Cycle State (Auto-Preserved)" in text) == (ccfg.kind == "todo_cycle")
    if ccfg.kind == "none" and ccfg.history == "full" and not guard and not meta:
        assert messages == ep.messages  # the trajectory as is
    if guard and has_tools and ccfg.history == "full" and ccfg.kind in ("none", "status"):
        assert [m for m in messages if m["role"] == "tool"] == [m for m in guard_trajectory(ep.messages) if m["role"] == "tool"]
