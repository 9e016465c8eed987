"""The bar's cadence (issue 39 item 6): at which turn ends a bar is shown, for both update strategies,
and refused where it cannot run."""
from __future__ import annotations

from dataclasses import replace

import pytest

import scenarios
from harness.context import ConditionConfig, apply
from harness.context.bar import Cadence, StatusBarConfig, bar_text, cadence, turn_ends
from harness.errors import ConfigError
from harness.flow.plan import make_plan
from harness.run import plan_spec
from scenarios.xfinity import XfinityConfig
from tests.conftest import make_cfg

# four calls to Xfinity with a search after each of the first two: turn ends after every tool result
EP = scenarios.build_episodes(XfinityConfig(calls_made=[4], distractor_turns=[2], placement=["interleaved"]))[0]


def _bars(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"].startswith("<agent_status>")]


def _shown(cad: str, update: str = "append", **kw) -> list[str]:
    return _bars(apply(EP, ConditionConfig(status=StatusBarConfig(update=update, cadence=Cadence(cad), **kw))))


def test_every_k_shows_every_kth_turn_end_from_the_first():
    ends = turn_ends(EP.messages)
    every = StatusBarConfig(update="append")
    assert _shown("every") == [bar_text(EP, every, e) for e in ends]
    assert _shown("every_k", cadence_k=2) == [bar_text(EP, every, e) for j, e in enumerate(ends) if j % 2 == 0]
    last_shown = (len(ends) - 1) % 3 == 0
    assert bool(_shown("every_k", update="replace", cadence_k=3)) == last_shown  # replace: the final prompt's bar only


def test_on_change_shows_a_bar_only_where_its_text_changed():
    shown = _shown("on_change")
    every = _shown("every")
    assert shown == [b for i, b in enumerate(every) if i == 0 or b != every[i - 1]] and len(shown) < len(every)


def test_at_limit_shows_bars_from_the_turn_end_the_target_reached_its_limit():
    ends = turn_ends(EP.messages)
    counts = [sum(1 for m in EP.messages[:e] for c in m.get("tool_calls") or []
                  if c["function"]["name"] == "phone_call" and "Xfinity" in c["function"]["arguments"]) for e in ends]
    flags = cadence(EP, StatusBarConfig(cadence=Cadence.at_limit))
    assert flags == [n >= 3 for n in counts] and any(flags) and not all(flags)
    assert all("reached (3/3)" in b or "4/3" in b or "over" in b.lower() for b in _shown("at_limit"))


def test_a_cadence_that_cannot_run_is_refused_at_config_time():
    with pytest.raises(ConfigError, match=r"conditions.status_at_limit.status.cadence: at_limit needs a call limit"):
        make_plan(plan_spec(make_cfg("scenario=todo_state", "condition=[status_at_limit]")))
    with pytest.raises(ConfigError, match="cadence_k"):
        StatusBarConfig(cadence=Cadence.every_k, cadence_k=0)


def test_the_default_cadence_keeps_every_sample_id():
    assert StatusBarConfig().cadence == Cadence.every
    assert ConditionConfig(status=StatusBarConfig()).identity() == ConditionConfig(
        status=replace(StatusBarConfig(), cadence=Cadence.every)).identity() == {"kind": "status", "format": "kv"}
