from __future__ import annotations

import json

import jinja2
import pytest

import scenarios
from harness.context import ConditionConfig, apply
from harness.context.bar import StatusBarConfig
from harness.context.status import RENDERERS, tag, tally
from harness.render import to_hermes
from harness.types import Rule
from tests.conftest import make_cfg, shared_template


def _call(name: str, **args) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


RULE = Rule("phone_call", "company", 3)
def status_block(messages, rule, fmt="kv", target=None) -> str:
    return tag(RENDERERS[fmt](tally(messages, rule, target)), fmt)


SEED_TRAJECTORY = [{"role": "user", "content": "fix my internet"}] + [_call("phone_call", company="Xfinity")] * 3


def test_prose_reproduces_the_seed_line_byte_for_byte():
    assert status_block(SEED_TRAJECTORY, RULE, "prose") == \
        "<agent_status>phone_call called 3 times, Xfinity at limit 3/3</agent_status>"


def test_kv_carries_the_constraint_check():
    assert status_block(SEED_TRAJECTORY, RULE, "kv") == (
        "<agent_status>\nphone_call: 3 calls (Xfinity: 3)\nlimit: 3 phone_call calls per company\n"
        "Maximum calls to Xfinity reached (3/3)\n</agent_status>")


def test_counts_are_per_company_and_per_tool():
    msgs = [_call("phone_call", company="Xfinity"), _call("web_search", query="x"), _call("phone_call", company="Verizon"),
            _call("phone_call", company="Xfinity")]
    # prose names the rule's tool only (the seed's sentence); kv keeps every tool's count
    assert status_block(msgs, RULE, "prose") == (
        "<agent_status>phone_call called 3 times (Xfinity 2, Verizon 1), Xfinity at 2/3, Verizon at 1/3</agent_status>")
    kv = status_block(msgs, RULE, "kv")
    assert "Calls to Xfinity: 2/3" in kv and "web_search: 1 calls" in kv and "Maximum" not in kv


def test_default_grid_prose_is_the_seed_sentence_and_names_an_uncalled_target():
    eps = scenarios.build_episodes(make_cfg().scenario)
    prose = ConditionConfig(status=StatusBarConfig(format="prose"))
    seed = [ep for ep in eps if ep.params["calls_made"] == 3]
    assert seed and all(apply(ep, prose)[-1]["content"] ==
                        "<agent_status>phone_call called 3 times, Xfinity at limit 3/3</agent_status>" for ep in seed)
    first = [{"role": "user", "content": "fix my internet"}, _call("web_search", query="x")]
    assert status_block(first, RULE, "kv", target="Xfinity") == (
        "<agent_status>\nweb_search: 1 calls\nphone_call: 0 calls\nlimit: 3 phone_call calls per company\n"
        "Calls to Xfinity: 0/3\n</agent_status>")
    assert status_block(first, RULE, "prose", target="Xfinity") == \
        "<agent_status>phone_call called 0 times, Xfinity at 0/3</agent_status>"
    lower = [_call("phone_call", company="xfinity")]  # counted under the target, as the grader matches it
    assert status_block(lower, RULE, "prose", target="Xfinity") == \
        "<agent_status>phone_call called 1 time, Xfinity at 1/3</agent_status>"


def _episodes():
    return scenarios.build_episodes(make_cfg("scenario.other_companies=[0,2]").scenario)


@pytest.mark.parametrize("fmt", ["kv", "prose"])
def test_status_tail_keeps_the_trajectory_byte_identical(fmt):
    for ep in _episodes():
        base = apply(ep, ConditionConfig())
        with_bar = apply(ep, ConditionConfig(status=StatusBarConfig(format=fmt)))
        assert json.dumps(with_bar[:-1]) == json.dumps(base)
        assert with_bar[-1]["role"] == "user" and with_bar[-1]["content"].startswith("<agent_status>")
        assert ep.messages == base  # the episode itself is never mutated


def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(jinja2.TemplateError(msg))
    return env.from_string(shared_template(name))


@pytest.mark.parametrize("template, hermes", [("Qwen-Qwen3-0.6B.jinja", False), ("Qwen-Qwen2.5-7B-Instruct.jinja", True)])
def test_rendered_prompt_of_none_is_a_prefix_of_status_tail(template, hermes):
    tpl = _template(template)
    ep = _episodes()[0]

    def render(msgs, gen):
        msgs = to_hermes(msgs, ep.tools) if hermes else msgs
        return tpl.render(messages=msgs, tools=None if hermes else ep.tools, add_generation_prompt=gen)

    none = render(apply(ep, ConditionConfig()), False)
    tail = render(apply(ep, ConditionConfig(status=StatusBarConfig())), True)
    assert tail.startswith(none) and "<agent_status>" in tail[len(none):]


def test_hermes_rendering_keeps_every_call_record():
    ep = _episodes()[0]
    converted = to_hermes(ep.messages, ep.tools)
    assert "<tools>" in converted[0]["content"] and '"phone_call"' in converted[0]["content"]
    text = json.dumps(converted[1:])
    assert text.count("<tool_call>") == sum(len(m.get("tool_calls") or []) for m in ep.messages)
    assert text.count("<tool_response>") == sum(m["role"] == "tool" for m in ep.messages)
    assert all(m["role"] in ("system", "user", "assistant") for m in to_hermes(ep.messages, ep.tools))
