"""Status-bar conditions: placement/role, tags, format, source (code/corrupted/none), history,
side channel, turn_meta, and a template that rejects a mid-conversation system message."""
from __future__ import annotations

import json

import jinja2
import pytest

import scenarios
from harness.context import ConditionConfig, apply
from harness.context.bar import BarSource, Placement, StatusBarConfig, Update, turn_ends
from harness.context.loop_guard import LoopGuardConfig
from harness.context.status import Wrapper, corrupt, tally
from harness.context.strategy import STRATEGIES, reuse_table
from harness.context.turn_meta import TurnMetaConfig
from harness.errors import ConfigError
from harness.render import to_hermes
from tests.conftest import REPO, TEST_MODEL, make_cfg, shared_template


def _episodes(*overrides):
    return scenarios.build_episodes(make_cfg(*overrides).scenario)


EP = _episodes("scenario.other_companies=[2]", "scenario.calls_made=[3]")[0]
BASE = apply(EP, ConditionConfig())


def bar(**status) -> ConditionConfig:
    """A condition showing the bar, with these bar settings."""
    return ConditionConfig(status=StatusBarConfig(**status))


def test_tail_head_mid_placements():
    tail = apply(EP, bar())
    assert tail[:-1] == BASE and tail[-1]["role"] == "user" and tail[-1]["content"].startswith("<agent_status>")
    head = apply(EP, bar(placement="head"))
    assert len(head) == len(BASE) and head[1:] == BASE[1:] and head[0]["role"] == "system"
    assert head[0]["content"].startswith(BASE[0]["content"] + "\n\n<agent_status>")  # merged: prefix changes
    mid = apply(EP, bar(placement="mid"))
    assert mid[:-2] == BASE[:-1] and mid[-2]["role"] == "system" and mid[-1] == BASE[-1]
    assert tail[-1]["content"] == head[0]["content"].split("\n\n")[-1] == mid[-2]["content"]


def test_tags_wrapper_and_visibility_switch_independently():
    plain = apply(EP, bar(format="prose"))[-1]["content"]
    internal = apply(EP, bar(format="prose", internal=True))[-1]["content"]
    both = apply(EP, bar(format="prose", internal=True, wrapper=Wrapper.system_reminder))[-1]["content"]
    assert internal == plain.replace("<agent_status>", '<agent_status visibility="internal">')
    assert both == f"<system-reminder>\n{internal}\n</system-reminder>"
    wrapped = apply(EP, bar(wrapper=Wrapper.system_reminder))[-1]["content"]
    assert wrapped.startswith("<system-reminder>\n<agent_status>\n") and wrapped.endswith("</agent_status>\n</system-reminder>")


def test_a_source_without_facts_adds_nothing_and_bar_only_drops_call_records():
    # source=model supplies no facts: without a writer's text there is no bar
    assert apply(EP, bar(source=BarSource.model)) == BASE
    bar_only = apply(EP, ConditionConfig(history="bar_only", status=StatusBarConfig()))
    assert not any(m["role"] == "tool" or m.get("tool_calls") for m in bar_only)
    assert bar_only[-1] == apply(EP, bar())[-1]  # facts still from the full trajectory
    assert [m["role"] for m in bar_only] == ["system", "user", "assistant", "user", "user"]


def test_corruption_is_seeded_and_off_by_one():
    cfg = bar(source="corrupted", corrupt_fraction=0.25)
    first, again = apply(EP, cfg)[-1]["content"], apply(EP, cfg)[-1]["content"]
    assert first == again and first != apply(EP, bar())[-1]["content"]
    truth = tally(EP.messages, EP.rule)
    for key in [EP.id, "another", "third"]:
        wrong = corrupt(truth, 0.25, key)
        diffs = [(a, b) for field in ("calls_by_tool", "calls_by_target")
                 for a, b in zip(getattr(truth, field).values(), getattr(wrong, field).values()) if a != b]
        n_facts = len(truth.calls_by_tool) + len(truth.calls_by_target)
        assert len(diffs) == round(0.25 * n_facts) and all(abs(a - b) == 1 for a, b in diffs)
    assert len({str(corrupt(truth, 0.25, k)) for k in map(str, range(20))}) > 1  # differs by episode
    everything = corrupt(truth, 1.0, EP.id)
    assert all(everything.calls_by_target[k] != v for k, v in truth.calls_by_target.items())


def test_side_channel_adds_volatile_signals_reproducibly():
    cfg = bar(side_channel=True)
    text = apply(EP, cfg)[-1]["content"]
    assert text == apply(EP, cfg)[-1]["content"]
    lines = text.split("\n")
    assert lines[-4].startswith("time: ") and lines[-4].endswith(" UTC") and lines[-3].startswith("last call duration: ")
    assert lines[-2].startswith("retries: ")
    assert "\n".join(lines[:-4]) == apply(EP, bar())[-1]["content"].rsplit("\n", 1)[0]


def test_turn_meta_last_only_is_the_first_block_of_the_last_user_message():
    out = apply(EP, ConditionConfig(turn_meta=TurnMetaConfig(last_only=True, date="2026-02-03")))
    assert out[:-1] == BASE[:-1]
    assert out[-1]["content"].startswith("<turn_meta>\nDate: 2026-02-03\n")
    assert out[-1]["content"].endswith("</turn_meta>\n\n" + BASE[-1]["content"])


def test_turn_meta_opens_every_user_message_with_its_own_working_set():
    out = apply(EP, ConditionConfig(turn_meta=TurnMetaConfig(date="2026-02-03", model="qwen3-8b", thinking="on")))
    users = [i for i, m in enumerate(BASE) if m["role"] == "user"]
    assert len(users) == 2 and [i for i, m in enumerate(out) if m["content"] != BASE[i]["content"]] == users[:1]
    assert out[users[0]]["content"].startswith("<turn_meta>\nDate: 2026-02-03\nModel: qwen3-8b (thinking: on)\n")
    # phone calls touch no path: the question's block would be the request's bytes, so the
    # day-stable dedup does not send it again
    assert out[users[1]] == BASE[users[1]]


def test_compaction_needs_a_compaction_point():
    with pytest.raises(ConfigError, match="condition.history"):
        apply(EP, ConditionConfig(history="compacted"))


# enumerations fail at composition, naming the full key and the allowed values
@pytest.mark.parametrize("preset, override, key", [
    ("status_tail", "status.placement=side", r"expected one of \[tail, head, mid\].*conditions.status_tail.status.placement"),
    ("status_tail", "status.source=model2", "conditions.status_tail.status.source"),
    ("status_tail", "status.corrupt_fraction=0", "condition.status.corrupt_fraction"),
    ("turn_meta", "turn_meta.date=today", "condition.turn_meta.date"),
    ("status_tail", "history=none", "conditions.status_tail.history"),
    ("status_tail", "status.wrapper=xml", "conditions.status_tail.status.wrapper")])
def test_bad_condition_values_name_the_key(preset, override, key):
    with pytest.raises(ConfigError, match=key):
        make_cfg(f"condition=[{preset}]", f"conditions.{preset}.{override}")


def test_every_condition_file_composes_and_applies_to_xfinity():
    names = sorted(p.stem for p in (REPO / "conf" / "condition").glob("*.yaml"))
    cfg = make_cfg(f"condition=[{','.join(names)}]")
    for name, ccfg in cfg.conditions.items():
        if ccfg.history == "compacted" or ccfg.kind.startswith("todo_") or ccfg.kind == "ledger":
            continue  # need a family with a compaction point (todo_state, ledger), tested in test_families
        assert json.dumps(apply(EP, ccfg))


def test_a_strict_template_rejects_the_mid_system_message():
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(jinja2.TemplateError(msg))
    env.globals["strftime_now"] = lambda fmt: "2026-01-15"
    tpl = env.from_string(shared_template("Mistral-Small-3.2-24B-Instruct-2506.jinja"))
    render = lambda msgs: tpl.render(messages=to_hermes(msgs, EP.tools), bos_token="", eos_token="")  # noqa: E731
    render(apply(EP, bar(placement="head")))
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        render(apply(EP, bar(placement="mid")))


@pytest.mark.model
def test_hf_backend_turns_a_template_rejection_into_an_error_record():
    from harness.backends import make_backend
    from harness.run import first_steps
    from tests.conftest import record_of

    cfg = make_cfg("condition=[status_mid,status_head]", "scenario.calls_made=[3]", "scenario.placement=[early]",
                   "scenario.episodes_per_cell=1", "model.generation.max_new_tokens=2")
    backend = make_backend(cfg.model, cfg.backend)
    backend.tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('System message must be at the beginning.') }}{% endif %}{{ m['content'] }}{% endfor %}")
    plan = first_steps(cfg)
    done = backend.generate([s.request for s in plan])
    records = {s.condition: record_of(s, c, cfg) for s, c in zip(plan, done)}
    assert records["status_mid"].label == "error" and "System message must be at the beginning" in records["status_mid"].error
    assert records["status_head"].error is None


def test_update_strategies_append_keeps_every_bar_replace_only_the_last():
    replace_ = apply(EP, bar())
    append = apply(EP, bar(update="append"))
    bars = [m["content"] for m in append if m["content"] and m["content"].startswith("<agent_status>")]
    assert len(bars) == len(turn_ends(EP.messages)) and bars[-1] == replace_[-1]["content"]
    assert [m for m in append if m["content"] not in bars] == BASE  # the trajectory itself untouched
    assert "Calls to Xfinity: 1/3" in "".join(bars[:-1]) and "Maximum calls to Xfinity reached (3/3)" in bars[-1]
    with pytest.raises(ConfigError, match="condition.status.update"):
        StatusBarConfig(update=Update.append, placement=Placement.head)


def test_shared_prefix_per_turn_by_strategy():
    def chars(messages):  # a tokenizer whose tokens are characters: prefixes of text are prefixes of ids
        return [ord(c) for c in "".join(f"<{m['role']}>{m.get('content') or ''}{m.get('tool_calls') or ''}" for m in messages)]

    rows = reuse_table(EP, StatusBarConfig(), chars)
    by = {(r["strategy"], r["turn"]): r for r in rows}
    turns = len(turn_ends(EP.messages))
    assert {r["strategy"] for r in rows} == set(STRATEGIES) and len(rows) == 3 * turns
    for t in range(2, turns + 1):
        for strategy in ("append", "reflow"):  # append-only: the whole previous prompt is reused
            assert by[(strategy, t)]["shared_with_previous"] == by[(strategy, t - 1)]["prompt_tokens"]
        # replace: the previous bar was removed, so reuse stops where it began
        assert by[("replace", t)]["shared_with_previous"] < by[("replace", t - 1)]["prompt_tokens"]
        assert by[("replace", t)]["shared_with_previous"] >= by[("reflow", t - 1)]["prompt_tokens"]
    assert by[("append", turns)]["prompt_tokens"] > by[("replace", turns)]["prompt_tokens"] > by[("reflow", turns)]["prompt_tokens"]


def test_strategy_tokenizes_what_the_backends_send_with_a_native_tools_template():
    """With a template that takes tools, the strategy tool's prompts carry the tool schemas, exactly
    as the hf and vllm backends render them (the same PromptRenderer)."""
    from transformers import AutoTokenizer

    from harness.context.strategy import prompts_by_turn
    from harness.models import sources
    from harness.render import PromptRenderer
    from harness.tools.strategy import prompt_tokenizer
    from tests.test_attention import QWEN3_LIKE

    model_cfg = make_cfg().model
    tok = AutoTokenizer.from_pretrained(sources.resolve(model_cfg)[0])
    tok.chat_template = QWEN3_LIKE
    render = PromptRenderer(tok, model_cfg)
    assert render.native_tools
    prompt = prompts_by_turn(EP, "replace", StatusBarConfig())[-1]
    ids = prompt_tokenizer(tok, model_cfg)(prompt, EP.tools)
    text = tok.decode(ids)
    assert "<tools>" in text and json.dumps(EP.tools[0]["function"]["description"])[1:-1] in text
    assert ids == tok(render(prompt, EP.tools), add_special_tokens=False)["input_ids"]


def test_model_written_bar_two_stage_run(tmp_path):
    from harness.run import first_steps
    from tests.conftest import run_cli

    grid = ["scenario.calls_made=[2,3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1"]
    main, writer = tmp_path / "main.jsonl", tmp_path / "writer.jsonl"
    main.write_text("")
    plan = first_steps(make_cfg("condition=[status_model]", "backend=scripted", f"backend.path={main}", *grid))
    main.write_text("".join(json.dumps({"episode_id": s.episode.id, "condition": s.condition, "text": "Done."}) + "\n"
                            for s in plan))
    bar = "<think>1, 2, 3</think><agent_status>phone_call called 3 times, Xfinity at limit 3/3</agent_status>"
    writer.write_text(json.dumps({"episode_id": plan[1].episode.id, "condition": "status_model:writer", "text": bar,
                                  "usage": {"prompt_tokens": 321, "completion_tokens": 17}}) + "\n")  # plan[0]: none
    res = run_cli("condition=[status_model]", "backend=scripted", f"backend.path={main}", *grid, f"run.root={tmp_path}",
                  "run.report=false", f'conditions.status_model.status.writer_overrides=["backend=scripted","backend.path={writer}"]',
                  "conditions.status_model.status.format=prose")
    assert res.returncode == 0, res.stderr
    run_dir = next(tmp_path.rglob("records.jsonl")).parent
    records = {r["episode_id"]: r for r in map(json.loads, (run_dir / "records.jsonl").read_text().splitlines())}
    ok, missing = records[plan[1].episode.id], records[plan[0].episode.id]
    assert ok["writer"]["bar"] == "<agent_status>phone_call called 3 times, Xfinity at limit 3/3</agent_status>"
    assert (ok["writer"]["prompt_tokens"], ok["writer"]["completion_tokens"], ok["writer"]["scripted"]) == (321, 17, True)
    prompt = next(p for p in map(json.loads, (run_dir / "prompts.jsonl").read_text().splitlines())
                  if p["prompt_sha256"] == ok["prompt_sha256"])
    assert prompt["messages"][-1] == {"role": "user", "content": ok["writer"]["bar"]}  # the main model saw it last
    assert missing["label"] == "error" and missing["error"].startswith("writer: scripted: no completion")


@pytest.mark.model
def test_strategy_command_prints_shared_prefix_tokens_per_turn(capsys):
    from harness.tools.strategy import main

    main([TEST_MODEL, "scenario.calls_made=[2]", "scenario.placement=[early]"])
    out = capsys.readouterr().out
    assert "shared_with_previous" in out and all(s in out for s in STRATEGIES)


def test_new_condition_fields_at_their_defaults_keep_sample_ids():
    assert bar(format="prose").identity() == {"kind": "status", "format": "prose"}
    # a bar setting away from its default is named under its mechanism
    assert bar(placement="mid").identity() == {"kind": "status", "format": "kv", "status": {"placement": "mid"}}


def test_corrupting_a_todo_bar_moves_the_in_progress_step():
    ep = scenarios.build_episodes(make_cfg("scenario=todo_state", "scenario.ask=[current]").scenario)[0]
    true_bar = apply(ep, bar())[-1]["content"]
    wrong_bar = apply(ep, bar(source="corrupted", corrupt_fraction=1.0))[-1]["content"]
    assert f"in progress: #2 {ep.facts['answer']}" in true_bar
    assert ep.facts['answer'] not in wrong_bar.split("in progress: ")[1].split("\n")[0]


def test_turn_meta_goes_on_the_users_question_not_on_the_bar():
    meta_cfg = TurnMetaConfig(date="2026-02-03")
    meta = apply(EP, ConditionConfig(turn_meta=meta_cfg))
    for cfg in (ConditionConfig(status=StatusBarConfig(), turn_meta=meta_cfg),
                ConditionConfig(status=StatusBarConfig(update=Update.append), turn_meta=meta_cfg)):
        out = apply(EP, cfg)
        assert out[-1]["content"].startswith("<agent_status>") and "<turn_meta>" not in out[-1]["content"]
        assert [m for m in out if not (m["content"] or "").startswith("<agent_status>")] == meta
    tail = apply(EP, ConditionConfig(status=StatusBarConfig(), turn_meta=meta_cfg))
    assert tail[:-1] == meta and tail[-1] == apply(EP, bar())[-1]


def test_appended_bars_do_not_reset_the_loop_guard():
    ep = next(e for e in _episodes("scenario=loop_guard", "scenario.mode=[identical]", "scenario.repeats=[3]"))
    guarded = apply(ep, ConditionConfig(loop_guard=LoopGuardConfig()))
    out = apply(ep, ConditionConfig(status=StatusBarConfig(update=Update.append), loop_guard=LoopGuardConfig()))
    assert len([m for m in out if (m["content"] or "").startswith("<agent_status>")]) == len(turn_ends(ep.messages)) > 2
    assert [m for m in out if not (m["content"] or "").startswith("<agent_status>")] == guarded
    assert [m["content"] for m in out if m["role"] == "tool"][-1].startswith("This call (read_file) has already been made 2 times")
