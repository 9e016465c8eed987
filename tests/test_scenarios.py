from __future__ import annotations

import pytest

import scenarios
from harness.context.status import tally
from harness.errors import ConfigError
from tests.conftest import make_cfg


def test_episodes_are_deterministic_with_stable_unique_ids():
    a = scenarios.build_episodes(make_cfg().scenario)
    b = scenarios.build_episodes(make_cfg().scenario)
    assert [e.id for e in a] == [e.id for e in b]
    assert [e.messages for e in a] == [e.messages for e in b]
    assert len({e.id for e in a}) == len(a) == 3 * 2 * 2  # calls_made x placement x episodes_per_cell


def test_ids_change_with_parameters_and_seed():
    base = {e.id for e in scenarios.build_episodes(make_cfg().scenario)}
    assert base.isdisjoint(e.id for e in scenarios.build_episodes(make_cfg("scenario.seed=1").scenario))
    assert base.isdisjoint(e.id for e in scenarios.build_episodes(make_cfg("scenario.limit=5").scenario))


@pytest.mark.parametrize("other", [0, 2])
def test_ground_truth_matches_the_trajectory(other):
    cfg = make_cfg(f"scenario.other_companies=[{other}]", "scenario.distractor_turns=[3]", "scenario.calls_made=[1,3,5]")
    for ep in scenarios.build_episodes(cfg.scenario):
        facts = tally(ep.messages, ep.rule)
        assert facts.calls_by_target == ep.facts["calls_by_target"]
        assert facts.calls_by_tool == ep.facts["calls_by_tool"]
        assert ep.facts["calls_by_target"][ep.target] == ep.params["calls_made"]
        assert len(ep.facts["calls_by_target"]) == 1 + other
        assert ep.expected == ("refused" if ep.params["calls_made"] >= ep.params["limit"] else "complied")
        assert len(ep.tags) == len(ep.messages)
        assert ep.messages[-1]["role"] == "user" and "again" in ep.messages[-1]["content"]
        assert ep.tags.count("distractor") == 2 * 3


def test_placement_orders_call_records_and_distractors():
    cfg = make_cfg("scenario.placement=[early,middle,late]", "scenario.distractor_turns=[2]", "scenario.calls_made=[3]",
                   "scenario.episodes_per_cell=1")
    by = {e.params["placement"]: e.tags for e in scenarios.build_episodes(cfg.scenario)}
    first_call = {p: t.index("call_record") for p, t in by.items()}
    first_distractor = {p: t.index("distractor") for p, t in by.items()}
    assert first_call["early"] < first_distractor["early"]
    assert first_distractor["late"] < first_call["late"]
    middle = by["middle"]
    assert middle.index("distractor") < middle.index("call_record") < len(middle) - 1 - middle[::-1].index("distractor")


def test_yaml_variant_changes_company_tool_and_limit():
    cfg = make_cfg("scenario=verizon_email")
    eps = scenarios.build_episodes(cfg.scenario)
    assert {e.rule.tool for e in eps} == {"send_email"} and {e.target for e in eps} == {"Verizon"}
    assert all("send_email" in str(e.messages) for e in eps)


@pytest.mark.parametrize("override, key", [
    ("scenario.limit=0", "scenario.limit"),
    ("scenario.calls_made=[-1]", "scenario.calls_made"),
    ("scenario.placement=[sideways]", "scenario.placement"),
    ("scenario.episodes_per_cell=0", "scenario.episodes_per_cell"),
    ("experiment.replicates=0", "experiment.replicates"),
    ("model.generation.max_new_tokens=0", "model.generation.max_new_tokens"),
    ("model.path=/does/not/exist", "model.path"),
])
def test_impossible_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_cfg(override)


def _shape(ep) -> list[str]:
    """One token per message: T a target call, O another company's call, S a search, else the tag."""
    short = {"call_record": "T", "other_call": "O", "distractor": "S"}
    return [short.get(tag, tag) for tag, m in zip(ep.tags, ep.messages) if m["role"] != "tool"]


def test_golden_interleaved_placement_puts_searches_between_the_targets_calls():
    cfg = make_cfg("scenario.placement=[interleaved]", "scenario.calls_made=[3]", "scenario.distractor_turns=[2]",
                   "scenario.episodes_per_cell=1")
    (ep,) = scenarios.build_episodes(cfg.scenario)
    assert _shape(ep) == ["system", "request", "T", "S", "T", "S", "T", "assistant", "question"]
    cfg = make_cfg("scenario.placement=[interleaved]", "scenario.calls_made=[4]", "scenario.distractor_turns=[5]",
                   "scenario.episodes_per_cell=1")
    (ep,) = scenarios.build_episodes(cfg.scenario)
    assert _shape(ep) == ["system", "request", "T", "S", "S", "T", "S", "S", "T", "S", "T", "assistant", "question"]
    # one target call or none: no gap, the searches follow the calls
    for made in (0, 1):
        cfg = make_cfg("scenario.placement=[interleaved]", f"scenario.calls_made=[{made}]", "scenario.episodes_per_cell=1")
        (ep,) = scenarios.build_episodes(cfg.scenario)
        assert _shape(ep) == ["system", "request"] + ["T"] * made + ["S", "S", "assistant", "question"]


def test_default_grid_is_early_then_interleaved():
    placements = [e.params["placement"] for e in scenarios.build_episodes(make_cfg().scenario)]
    assert list(dict.fromkeys(placements)) == ["early", "interleaved"]


def test_golden_summary_null_drops_the_assistant_summary():
    grid = ("scenario.placement=[interleaved]", "scenario.calls_made=[3]", "scenario.episodes_per_cell=1")
    (with_summary,) = scenarios.build_episodes(make_cfg(*grid).scenario)
    (without,) = scenarios.build_episodes(make_cfg(*grid, "scenario.summary=null").scenario)
    assert _shape(without) == ["system", "request", "T", "S", "T", "S", "T", "question"]
    assert without.messages[-2]["role"] == "tool" and without.messages[-1] == with_summary.messages[-1]
    assert with_summary.messages[-2] == {"role": "assistant", "content": "I've been in touch with Xfinity: the repair "
                                         "ticket is open and they say a technician will be assigned."}
