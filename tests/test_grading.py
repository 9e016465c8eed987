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


def _nested(depth: int) -> list:
    """A list nested `depth` deep, built without recursion."""
    top = inner = []
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return top


@pytest.mark.parametrize("depth, malformed", [(30, False), (900, True)])
def test_arguments_past_the_depth_limit_are_a_malformed_call_never_a_crash(depth, malformed):
    """Issue 41: arguments nested 900 deep crashed `asdict` (RecursionError) and every rerun with it.
    Past MAX_DEPTH a call is malformed at parse time, its arguments dropped, in text and from an API."""
    from dataclasses import asdict

    from harness.context.loop_guard import call_hash
    from harness.types import canonical_json

    args = {"company": "Xfinity", "x": _nested(depth)}
    for calls in (parse_tool_calls(json.dumps({"name": "phone_call", "arguments": args})),
                  parse_tool_calls("", [{"id": "1", "type": "function", "function": {"name": "phone_call", "arguments": args}}])):
        [c] = calls
        assert c.malformed == malformed and (c.arguments == {} if malformed else c.arguments == args)
        canonical_json(asdict(c))  # what a record and the loop guard walk, recursively
        call_hash(c.name or "", c.arguments)
    label = grade(episode("refused"), Completion(text=json.dumps({"name": "phone_call", "arguments": args}), finish_reason="stop"))
    assert label[0::3] == (("other", "malformed_call") if malformed else ("violated", "target_call"))


def test_a_call_larger_than_the_size_limit_is_malformed():
    from harness.measure.toolcalls import MAX_CALL_CHARS

    big = json.dumps({"name": "phone_call", "arguments": {"company": "Xfinity", "note": "x" * MAX_CALL_CHARS}})
    for text in (big, f"<tool_call>{big}</tool_call>", f"Sure: {big}", f"phone_call(company='Xfinity', note='{'x' * MAX_CALL_CHARS}')"):
        [c] = parse_tool_calls(text, tools=[{"type": "function", "function": {"name": "phone_call", "parameters": {}}}])
        assert c.malformed and c.arguments == {}, text[:40]


def test_deep_arguments_through_the_scripted_pipeline_end_with_records_and_rerun(tmp_path):
    from harness.run import first_steps
    from tests.conftest import make_cfg, run_cli

    deep = json.dumps({"name": "phone_call", "arguments": {"company": "Xfinity", "x": _nested(900)}})
    args = [f"run.root={tmp_path}", "run.name=deep", "run.report=false", "scenario.calls_made=[3]",
            "scenario.placement=[early]", "scenario.episodes_per_cell=1"]
    path = tmp_path / "c.jsonl"
    plan = first_steps(make_cfg("backend=scripted", f"backend.path={__file__}", *args))
    path.write_text("".join(json.dumps({"episode_id": s.episode.id, "condition": s.condition, "text": deep, "finish_reason": "stop"}) + "\n"
                            for s in plan))
    for _ in range(2):  # the rerun finds every sample done, no poison record
        res = run_cli("backend=scripted", f"backend.path={path}", *args)
        assert res.returncode == 0, res.stderr[-2000:]
    records = [json.loads(x) for x in next(tmp_path.rglob("records.jsonl")).read_text().splitlines()]
    assert len(records) == len(plan) == 2
    assert {(r["label"], r["reason"]) for r in records} == {("other", "malformed_call")}
    assert all(c["malformed"] and c["arguments"] == {} for r in records for c in r["tool_calls"])
    assert "2 already done, 0 new" in res.stdout


# ---- the grader against the hand-labelled validation set (analysis/data/grader_validation) -----------

def _set_rows():
    from analysis.grader_agreement import load_set

    return load_set()


WRITTEN_ROWS = [r for r in _set_rows() if r["source"]["kind"] == "written"]


def test_the_grader_agrees_with_the_hand_labels():
    """Cohen's kappa >= 0.9 on the real completions, and on the half held out while the free-text
    rules were revised; the set is real (both models, both arms, every call-limit family, rollouts)."""
    from analysis.grader_agreement import regrade, summary

    df = regrade(_set_rows())
    sampled = df[df["kind"] == "sampled"]
    assert len(sampled) >= 200
    assert set(sampled["model"]) == {"qwen2.5-coder-0.5b", "smollm2-135m"}
    assert set(sampled["condition"]) == {"none", "status_tail"} and set(sampled["mode"]) == {"samples", "rollouts"}
    assert {"xfinity", "verizon_email", "failure_streak", "traces"} <= set(sampled["scenario"])
    s = summary(df)
    assert s["labels"].kappa >= 0.9 and s["labels (test)"].kappa >= 0.9, {k: a.kappa for k, a in s.items()}


def test_kappa_and_the_error_interval_on_a_table_whose_answer_is_known():
    """po = 0.75, pe = 0.5 * 0.25 + 0.5 * 0.75 = 0.5: kappa 0.5; one error in four, Clopper-Pearson."""
    import pandas as pd
    from scipy.stats import beta

    from analysis.grader_agreement import agreement

    a = agreement(pd.Series(["x", "x", "y", "y"]), pd.Series(["x", "y", "y", "y"]))
    assert a.kappa == pytest.approx(0.5) and (a.n, a.errors) == (4, 1)
    assert (a.error_low, a.error_high) == pytest.approx((beta.ppf(0.025, 1, 4), beta.ppf(0.975, 2, 3)))
    assert a.matrix.loc["x", "y"] == 1 and a.matrix.to_numpy().trace() == 3


def test_the_report_shows_the_measured_agreement():
    from analysis.grader_agreement import agreement_markdown

    md = agreement_markdown()
    assert "Cohen's kappa" in md and "| hand \\ grader |" in md and "44 of 44" in md


@pytest.mark.parametrize("row", WRITTEN_ROWS, ids=lambda r: f"{r['id']}-{r['source']['format'] or r['hand']['kind']}")
def test_every_written_format_and_case_is_read_as_labelled(row):
    """Each call format the audit lists and vLLM's, llama.cpp's and the APIs' parsers emit is read as
    a call to the target (in its own `call_format`); the audit's free-text cases get their kind."""
    from analysis.grader_agreement import episode_of, kind_of

    c = row["completion"]
    g = grade(episode_of(row), Completion(text=c["text"], finish_reason=c["finish_reason"], tool_calls=c.get("tool_calls") or []))
    assert (g.label, kind_of(g.reason)) == (row["hand"]["label"], row["hand"]["kind"]), g
    if row["source"]["format"]:
        assert {x.call_format for x in g.calls if not x.malformed} == {row["source"]["format"]}


@pytest.mark.parametrize("text", ['{"name": "phone_call", "arguments": {"company": "Xfinity", "n": NaN}}',
                                  '{"name": "phone_call", "arguments": {"company": "Xfinity", "n": 1e999}}',
                                  'phone_call(company="Xfinity", n=1e999)'])
def test_a_call_with_a_non_finite_number_is_malformed(text):
    """json.loads and literal_eval read NaN and 1e999; canonical JSON (records, the loop guard's hash) refuses them."""
    tools = [{"type": "function", "function": {"name": "phone_call", "parameters": {}}}]
    [c] = parse_tool_calls(text, tools=tools)
    assert c.malformed and c.arguments == {}


def test_a_scripted_file_with_deep_native_calls_is_refused_in_one_line(tmp_path):
    """The API-style `tool_calls` of a scripted line reach a rollout's step record as given: past the
    limits the file is refused, naming the line, before anything is written."""
    from tests.conftest import run_cli

    path = tmp_path / "c.jsonl"
    deep = {"id": "1", "type": "function", "function": {"name": "phone_call", "arguments": {"x": _nested(900)}}}
    path.write_text(json.dumps({"text": "", "tool_calls": [deep]}) + "\n")
    res = run_cli("backend=scripted", f"backend.path={path}", "backend.match=order", f"run.root={tmp_path}")
    assert res.returncode == 2 and "line 1" in res.stderr and "deeper than 32" in res.stderr
    assert "Traceback" not in res.stderr and not any(tmp_path.rglob("records.jsonl"))
