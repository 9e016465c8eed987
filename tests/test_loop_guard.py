"""The loop guard: the seed's block message, thresholds, canonical hashing (properties), replay."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.context import ConditionConfig, view
from harness.context.loop_guard import (
    BLOCK_MESSAGE,
    LoopGuard,
    LoopGuardConfig,
    call_hash,
)
from harness.types import Episode, Rule


def test_block_message_is_quoted_from_the_seed(seed_text):
    assert BLOCK_MESSAGE in seed_text


def test_block_message():
    guard = LoopGuard()
    assert guard.check("read_file", {"path": "a"}) is None
    assert guard.check("read_file", {"path": "a"}) is None
    assert guard.check("read_file", {"path": "a"}) == (
        "This call (read_file) has already been made 2 times this turn with the same arguments — "
        "try a different approach or change the arguments.")
    assert guard.check("read_file", {"path": "b"}) is None  # other arguments: not a duplicate
    guard.new_turn()
    assert guard.check("read_file", {"path": "a"}) is None  # counted per turn


def test_failure_streak_warns_at_3_and_halts_at_8():
    guard = LoopGuard()
    notes = [guard.record(failed=True) for _ in range(9)]
    assert notes[:2] == [None, None]
    assert all(n.startswith("Warning: ") for n in notes[2:7]) and "3 consecutive" in notes[2]
    assert notes[7].startswith("Halted: 8 consecutive") and notes[8].startswith("Halted: 9")
    assert guard.record(failed=False) is None and guard.failures == 0


def test_paginated_reads_are_not_false_positives():
    guard = LoopGuard()
    for offset in range(0, 2000, 200):
        assert guard.check("read_file", {"path": "big.py", "offset": offset, "limit": 200}) is None


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                    max_leaves=8)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(max_size=6), JSON, max_size=5), st.randoms(use_true_random=False))
def test_hash_ignores_key_order_at_every_depth(args, rnd):
    def shuffled(obj):
        if isinstance(obj, dict):
            items = list(obj.items())
            rnd.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        return [shuffled(v) for v in obj] if isinstance(obj, list) else obj

    assert call_hash("t", args) == call_hash("t", shuffled(args))
    assert call_hash("t", args) == call_hash("t", json.loads(json.dumps(args)))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=10), st.integers(0, 10**6), st.integers(0, 10**6))
def test_hash_sees_every_value(path, a, b):
    same = call_hash("read_file", {"path": path, "offset": a}) == call_hash("read_file", {"offset": b, "path": path})
    assert same == (a == b)
    assert call_hash("read_file", {"path": path}) != call_hash("write_file", {"path": path})


def _round(i: int, args: dict, result: str) -> list[dict]:
    return [{"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": f"c{i}", "name": "read_file", "content": result}]


def guard_trajectory(messages: list[dict]) -> list[dict]:
    """The trajectory replayed through the guard: the loop_guard step alone, on a bare episode."""
    episode = Episode(id="e", scenario="s", family="f", params={}, messages=messages, tools=[],
                      rule=Rule("read_file", "path", 2), target="a", facts={}, expected="complied")
    return view(episode, ConditionConfig(loop_guard=LoopGuardConfig())).messages


def test_replay_answers_through_the_tool_result():
    msgs = [{"role": "user", "content": "go"}]
    for i in range(3):
        msgs += _round(i, {"path": "a", "offset": 0}, "same text")
    out = guard_trajectory(msgs)
    assert [m["content"] for m in out if m["role"] == "tool"][:2] == ["same text", "same text"]
    assert out[-1]["content"].startswith("This call (read_file) has already been made 2 times")
    assert len(out) == len(msgs) and msgs[-1]["content"] == "same text"  # never mutates its input
    fails = [{"role": "user", "content": "go"}]
    for i in range(3):
        fails += _round(i, {"path": "a", "offset": i}, "Error: boom")
    out = guard_trajectory(fails)
    assert out[-1]["content"].startswith("Error: boom\n\nWarning: 3 consecutive")
