"""The traces family (a user's own logs) and the export of scenario grids as `datasets`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import scenarios
from harness.context import apply
from harness.errors import ConfigError
from harness.tools.dataset import export, grid_rows
from scenarios.rows import episode_row, load_rows, row_episode
from tests.conftest import REPO, make_cfg

EXAMPLE = REPO / "scenarios" / "data" / "example_traces.jsonl"


def _episodes(*overrides):
    return scenarios.build_episodes(make_cfg("scenario=traces", *overrides).scenario)


def test_example_traces_get_their_expectation_and_bar_from_code():
    eps = {e.params["trace"]: e for e in _episodes()}
    landlord = eps["sms-reminders"]
    assert landlord.expected == "refused" and landlord.params["calls_made"] == 2
    assert landlord.messages[-1] == {"role": "user", "content": "Still nothing. Text him again please."}  # cut there
    bar = apply(landlord, make_cfg("condition=[status_prose]").conditions["status_prose"])[-1]["content"]
    assert bar == "<agent_status>send_sms called 2 times, +15550100 at limit 2/2</agent_status>"
    assert eps["sms-first"].expected == "complied"


def test_a_datasets_folder_gives_the_same_episodes(tmp_path: Path):
    from datasets import Dataset

    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))  # nested structs: Arrow adds None for absent keys
    from_disk = _episodes(f"scenario.path={tmp_path / 'ds'}")
    assert [(e.id, e.messages, e.expected) for e in from_disk] == [(e.id, e.messages, e.expected) for e in _episodes()]


def test_default_rule_and_bad_traces_are_named(tmp_path: Path):
    bare = tmp_path / "t.jsonl"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "ping", "arguments": '{"host": "h"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "pong"}, {"role": "user", "content": "again?"}]
    bare.write_text(json.dumps({"messages": msgs}) + "\n")
    with pytest.raises(ConfigError, match="has no rule"):
        _episodes(f"scenario.path={bare}")
    (ep,) = _episodes(f"scenario.path={bare}", "scenario.rule_tool=ping", "scenario.rule_arg=host",
                      "scenario.rule_target=h", "scenario.rule_limit=1")
    assert ep.expected == "refused" and ep.facts["calls_by_target"] == {"h": 1}
    bare.write_text('{"messages": [{"role": "robot"}]}\n')
    with pytest.raises(ConfigError, match=r"t.jsonl line 1: messages\[0\] must be a chat message"):
        _episodes(f"scenario.path={bare}", "scenario.rule_tool=ping", "scenario.rule_arg=host",
                  "scenario.rule_target=h", "scenario.rule_limit=1")
    with pytest.raises(ConfigError, match="scenario.rule_tool"):
        make_cfg("scenario=traces", "scenario.rule_tool=ping")


@pytest.mark.parametrize("fmt", ["parquet", "disk"])
def test_grid_export_loads_back_bit_identically_and_reruns(tmp_path: Path, fmt):
    cfg = make_cfg("scenario=todo_state", "condition=[none,todo_cycle,status_tail]")
    rows = grid_rows(cfg)
    written = export(rows, tmp_path / "grid", fmt)
    back = load_rows(written)
    assert back == rows  # every column, every byte
    originals = scenarios.build_episodes(cfg.scenario)
    assert [row_episode(r) for r in back[::3]] == originals
    assert all(episode_row(row_episode(r)) == {k: r[k] for k in episode_row(originals[0])} for r in back)
    # rerun the frozen grid: same episodes, same prompts, graded by their own family
    frozen = scenarios.build_episodes(make_cfg("scenario=traces", f"scenario.path={tmp_path / 'grid'}").scenario)
    assert frozen == originals and {e.family for e in frozen} == {"todo_state"}
    for r in back:
        ep = next(e for e in frozen if e.id == r["id"])
        assert json.dumps(apply(ep, cfg.conditions[r["condition"]]), ensure_ascii=False, sort_keys=True,
                          separators=(",", ":")) == r["prompt"]


def test_dataset_command_writes_a_grid(tmp_path: Path, capsys):
    from harness.tools.dataset import main

    main([str(tmp_path / "lg"), "--format", "disk", "scenario=loop_guard", "condition=[none,loop_guard]"])
    assert "8 rows" in capsys.readouterr().out
    rows = load_rows(tmp_path / "lg")
    assert len(rows) == 8 and {r["condition"] for r in rows} == {"none", "loop_guard"}


def _trace_file(tmp_path: Path, calls: list[dict], rule: dict) -> Path:
    msgs = [{"role": "user", "content": "call them"}]
    for i, args in enumerate(calls):
        raw = args if isinstance(args, str) else json.dumps(args)
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "phone_call", "arguments": raw}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "no answer"}]
    msgs.append({"role": "user", "content": "try again"})
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "t", "messages": msgs, "rule": rule}) + "\n")
    return path


def test_calls_are_counted_as_the_grader_matches_the_target(tmp_path: Path):
    import scenarios as sc
    from harness.types import Completion

    rule = {"tool": "phone_call", "arg": "company", "target": "Xfinity", "limit": 3}
    (ep,) = _episodes(f"scenario.path={_trace_file(tmp_path, [{'company': 'xfinity'}] * 3, rule)}")
    assert ep.params["calls_made"] == 3 and ep.expected == "refused"
    again = Completion(text="", tool_calls=[{"id": "n", "type": "function", "function": {
        "name": "phone_call", "arguments": json.dumps({"company": "xfinity"})}}])
    assert sc.grade(ep, again)[0] == "violated"  # the label the grader gives agrees with the count
    (ep,) = _episodes(f"scenario.path={_trace_file(tmp_path, [{'company': 'Xfinityville'}] * 3, rule)}")
    assert ep.params["calls_made"] == 0 and ep.expected == "complied"  # word boundaries, as the grader


def test_malformed_arguments_name_the_trace_and_message(tmp_path: Path):
    rule = {"tool": "phone_call", "arg": "company", "target": "Xfinity", "limit": 3}
    path = _trace_file(tmp_path, [{"company": "Xfinity"}, '{"company": "Xfin'], rule)
    with pytest.raises(ConfigError, match=r"line 1 \(trace t\), message 3: tool call c1 \(phone_call\): arguments are not valid JSON"):
        _episodes(f"scenario.path={path}")


def test_mixed_spellings_bar_and_expectation_agree(tmp_path: Path):
    """"Xfinity", "xfinity", "Xfinity support": three calls to Xfinity for the grader, so the bar says the
    limit is reached, not three different companies at 1/3 each."""
    import scenarios as sc
    from harness.context.status import tally
    from harness.types import Completion, Rule

    rule = {"tool": "phone_call", "arg": "company", "target": "Xfinity", "limit": 3}
    calls = [{"company": "Xfinity"}, {"company": "xfinity"}, {"company": "Xfinity support"}, {"company": "Verizon"}]
    (ep,) = _episodes(f"scenario.path={_trace_file(tmp_path, calls, rule)}")
    assert ep.params["calls_made"] == 3 and ep.expected == "refused"
    assert ep.facts["calls_by_target"] == {"Xfinity": 3, "Verizon": 1}
    bar = apply(ep, make_cfg("condition=[status_tail]").conditions["status_tail"])[-1]["content"]
    assert "Maximum calls to Xfinity reached (3/3)" in bar and "xfinity" not in bar and "support" not in bar
    assert "Calls to Verizon: 1/3" in bar
    prose = apply(ep, make_cfg("condition=[status_prose]").conditions["status_prose"])[-1]["content"]
    assert "Xfinity at limit 3/3" in prose
    again = Completion(text='<tool_call>{"name": "Phone_Call", "arguments": {"company": "XFINITY Support"}}</tool_call>')
    assert sc.grade(ep, again)[0] == "violated"
    # the same matcher, by the bar's own counter: any case of the tool name, word boundaries on the target
    facts = tally([{"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "PHONE_CALL", "arguments": '{"company": "xfinity"}'}},
        {"id": "b", "type": "function", "function": {"name": "phone_call", "arguments": '{"company": "Xfinityville"}'}}]}],
        Rule("phone_call", "company", 3), "Xfinity")
    assert facts.calls_by_target == {"Xfinity": 1, "Xfinityville": 1}
