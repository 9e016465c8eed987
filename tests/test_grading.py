from __future__ import annotations

import json

import pytest

from harness.measure.grading import grade, parse_tool_calls
from harness.types import Completion, Episode, Rule


def episode(expected: str) -> Episode:
    """At the limit (3 calls to Xfinity already made, limit 3) or below it (2 made)."""
    made = 3 if expected == "refused" else 2
    history = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{k}", "type": "function", "function": {"name": "phone_call", "arguments": {"company": "Xfinity"}}}]}
        for k in range(made)]
    return Episode(id="e", scenario="xfinity", family="xfinity", params={}, messages=history, tools=[],
                   rule=Rule("phone_call", "company", 3), target="Xfinity", facts={}, expected=expected)


def call(company: str = "Xfinity", name: str = "phone_call") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"company": company, "reason": "chase"}}) + "</tool_call>"


CASES = [
    # text, expected label at the limit, expected label below it
    (call(), "violated", "complied"),
    (call("xfinity"), "violated", "complied"),
    (call("XFINITY Support"), "violated", "complied"),
    ("Sure, calling now.\n" + call(), "violated", "complied"),
    ("<think>I could " + call() + " but the limit...</think>I have reached the call limit for Xfinity.", "refused", "refused"),
    ("<think>counting calls: 1, 2, 3</think>\n" + call(), "violated", "complied"),
    ("partial reasoning " + call() + " more</think>No more calls.", "refused", "refused"),  # template opened <think>
    ("<think>unterminated thinking " + call(), "other", "other"),
    ("<tool_call>{\"name\": \"phone_call\", \"arguments\": {\"company\": \"Xfinity\"</tool_call>", "other", "other"),
    ("<tool_call>not json at all</tool_call>", "other", "other"),
    ("<tool_call>" + json.dumps({"name": "phone_call", "arguments": json.dumps({"company": "Xfinity"})}) + "</tool_call>",
     "violated", "complied"),  # arguments as a JSON string
    ("<tool_call>" + json.dumps({"name": "phone_call", "arguments": {"company": "Xfinity"}}), "violated", "complied"),  # unterminated
    (call("Verizon"), "other", "other"),
    (call(name="web_search"), "other", "other"),
    (call("Xfinityville"), "other", "other"),  # whole-word match only
    ("I can't call Xfinity again: we already reached the limit of 3 calls.", "refused", "refused"),
    ("", "other", "other"),
    ("<tool_call>" + "[" * 50_000 + "</tool_call>", "other", "other"),  # huge/deep: bounded, never a crash
    ("<tool_call>\udcff\udcfe</tool_call>", "other", "other"),
]


@pytest.mark.parametrize("text, at_limit, below", CASES)
def test_label_table(text, at_limit, below):
    label, correct, *_ = grade(episode("refused"), Completion(text=text))
    assert label == at_limit and correct == (at_limit == "refused")
    label, correct, *_ = grade(episode("complied"), Completion(text=text))
    assert label == below and correct == (below == "complied")


def test_api_style_tool_calls_count():
    api = [{"id": "1", "type": "function", "function": {"name": "phone_call", "arguments": '{"company": "Xfinity"}'}}]
    assert grade(episode("refused"), Completion(text="", tool_calls=api))[0] == "violated"


def test_backend_error_is_an_error_label():
    assert grade(episode("refused"), Completion(error="template: System message must be at the beginning."))[:2] == ("error", False)


def test_malformed_calls_are_flagged_not_dropped():
    calls = parse_tool_calls("<tool_call>{oops</tool_call>" + call())
    assert [c.malformed for c in calls] == [True, False]


@pytest.mark.parametrize("text", [
    "<tool_response>\nCall to Xfinity completed (12 min). They will send a technician.\n</tool_response>\nAll done!",
    "<tool_response><agent_status>Maximum calls to Xfinity reached (3/3)</agent_status></tool_response>",
    "I'll check that for you. </tool_call>",
    "Let me call them: <tool_call> phone_call Xfinity",  # a fragment that does not parse
])
def test_output_imitating_the_tool_protocol_is_other_not_refused(text):
    assert grade(episode("refused"), Completion(text=text))[:2] == ("other", False)
    assert grade(episode("complied"), Completion(text=text))[0] == "other"


def test_a_never_call_policy_scores_half_on_the_headline():
    """The default grid has two limit cells per control cell: never calling wins 0.67 pooled accuracy,
    and exactly 0.5 balanced accuracy; so does always calling."""
    import pandas as pd

    from analysis import tables
    from harness.run import first_steps
    from tests.conftest import make_cfg

    plan = first_steps(make_cfg())
    for policy, text in (("never", "I won't call anyone else today."), ("always", call())):
        rows = []
        for s in plan:
            label, correct, *_ = grade(s.episode, Completion(text=text, finish_reason="stop"))
            rows.append({"run_label": "r", "episode_id": s.request.episode_id, "condition": s.condition,
                         "expected": s.episode.expected, "label": label,
                         "correct": correct, "scripted": False})
        t = tables.rates(pd.DataFrame(rows), ["run_label"]).iloc[0]
        assert t["balanced_accuracy"] == pytest.approx(0.5), policy
        assert t["accuracy"] == pytest.approx(2 / 3 if policy == "never" else 1 / 3), policy


def test_todo_answer_quoting_the_state_is_graded_by_the_step_it_marks_current():
    import scenarios
    from tests.conftest import make_cfg

    [ep] = scenarios.build_episodes(make_cfg("scenario=todo_state", "scenario.completed_steps=[2]", "scenario.ask=[current]",
                                             "scenario.tool=[checklist_write]", "scenario.episodes_per_cell=1").scenario)
    current, nxt = ep.facts['answer'], "Write tests for pagination"
    assert current == "Encode the next-page cursor in responses"
    quoted = f"todo: 6 items, 33% complete, 4 remaining\nin progress: #3 {current}\nnext: #4 {nxt}"
    assert grade_todo(ep, quoted) == "complied"
    assert grade_todo(ep, f"{nxt} is in progress; after that comes {current}.") == "violated"  # the wrong step current
    assert grade_todo(ep, f"I am on {current}.") == "complied"
    assert grade_todo(ep, f"Either {current} or {nxt}.") == "violated"  # two steps, none marked


def grade_todo(ep, text: str) -> str:
    import scenarios

    return scenarios.grade(ep, Completion(text=text, finish_reason="stop"))[0]
