"""<turn_meta>, diagnostics, truncation envelope and the injection ledger."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from harness.context import ConditionConfig, view
from harness.context.diagnostics import Diagnostic, diagnostics_message
from harness.context.ledger import (
    PREVIEW_ADVICE,
    Ledger,
    cap_item,
    estimate_tokens,
    read_previews,
    recalled_items,
)
from harness.context.loop_guard import LoopGuardConfig
from harness.context.truncation import truncate
from harness.context.turn_meta import (
    TurnMetaConfig,
    WorkingSet,
    active_paths,
    turn_meta,
)
from harness.types import Episode, Rule

DIAG = """<diagnostics file="crates/tui/src/foo.rs">
  ERROR [12:8] missing semicolon
  ERROR [13:1] expected `,`, found `}`
</diagnostics>"""


TURN_META_LINES = ('lines.push("## Repo Working Set".to_string());', "Active paths (prioritize these):",
                   "When in doubt, use tools to verify and keep changes focused on the working set.")


@pytest.mark.parametrize("golden", [DIAG, "(Original: {raw_chars} chars, omitted: {omitted} chars.)", PREVIEW_ADVICE,
                                    *TURN_META_LINES])
def test_goldens_are_quoted_from_the_seed(golden, seed_text):
    assert golden in seed_text


def test_diagnostics_block():
    msg = diagnostics_message({"crates/tui/src/foo.rs": [Diagnostic(12, 8, "missing semicolon"),
                                                          Diagnostic(13, 1, "expected `,`, found `}`")]})
    assert msg == {"role": "user", "content": DIAG}
    two = diagnostics_message({"a.rs": [Diagnostic(1, 1, "x")], "b.rs": [Diagnostic(2, 2, "y")], "c.rs": []})
    assert two["content"].count("<diagnostics file=") == 2  # all files, one message
    assert diagnostics_message({}) is None and diagnostics_message({"a.rs": []}) is None  # silent when absent


def test_truncation_envelope():
    text = "x" * 1000
    assert truncate(text, 1000) == text
    assert truncate(text, 300) == "x" * 300 + "\n(Original: 1000 chars, omitted: 700 chars.)"


def _episode(messages: list) -> Episode:
    """A bare episode around `messages` (what the pipeline's steps read of it)."""
    return Episode(id="e", scenario="s", family="f", params={}, messages=messages, tools=[],
                   rule=Rule("read_file", "path", 2), target="a", facts={}, expected="complied")


def _call(path: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}]}


def test_turn_meta_working_set_and_day_stability():
    paths = active_paths([_call("a.py"), _call("b.py"), _call("a.py")])
    assert paths == ["a.py", "b.py"]  # most recent first, once each
    ws = WorkingSet("/repo", key_files=("Cargo.toml", "README.md"), top_dirs=("crates",), active=tuple(paths))
    morning = turn_meta(dt.datetime(2026, 3, 4, 8, 1), "qwen3-0.6b", "low", ws)
    evening = turn_meta(dt.datetime(2026, 3, 4, 23, 59), "qwen3-0.6b", "low", ws)
    assert morning == evening  # byte-stable within a day
    assert morning != turn_meta(dt.date(2026, 3, 5), "qwen3-0.6b", "low", ws)
    assert morning == (
        "<turn_meta>\nDate: 2026-03-04\nModel: qwen3-0.6b (thinking: low)\n## Repo Working Set\nWorkspace: /repo\n"
        "Key files: Cargo.toml, README.md\nTop-level directories: crates/\nActive paths (prioritize these):\n"
        "- a.py (file)\n- b.py (file)\n"
        "When in doubt, use tools to verify and keep changes focused on the working set.\n</turn_meta>")


def test_ledger_dedups_bytes_then_dry_runs_the_budget():
    transcript = [{"role": "user", "content": "hello"}, {"role": "user", "content": "<turn_meta>x</turn_meta>"}]
    ledger = Ledger(budget_tokens=estimate_tokens(transcript) + 20)
    assert ledger.admit(transcript, {"role": "user", "content": "<turn_meta>x</turn_meta>"}) == "duplicate"
    assert ledger.admit(transcript, {"role": "user", "content": "<turn_meta>x</turn_meta> "}) == "ok"  # one byte differs
    assert ledger.admit(transcript, {"role": "user", "content": "y" * 400}) == "over_budget"
    assert ledger.inject(transcript, {"role": "user", "content": "y" * 400}) == transcript
    exact = Ledger(budget_tokens=2, count_tokens=len)  # a real counter can be passed in
    assert exact.admit(transcript, {"role": "user", "content": "z"}) == "over_budget"


def test_recall_quotas():
    items = [f"item {i}" for i in range(9)]
    assert recalled_items(items) == items[:5]
    long_lines = "\n".join(f"line {i}" for i in range(100))
    assert cap_item(long_lines).count("\n") == 29
    big = "é" * 8000  # 16,000 bytes in UTF-8
    capped = cap_item(big)
    assert len(capped.encode()) <= 10 * 1024 and capped == "é" * (5 * 1024)


def test_read_previews_keep_the_last_12_with_the_advice_line():
    reads = [(f"f{i}.py", str(i) * 5000) for i in range(20)]
    text = read_previews(reads)
    assert text.count("### f") == 12 and "### f8.py" in text and "### f7.py" not in text
    assert str(19) * 600 in text and "19" * 601 not in text  # 1,200 characters each
    assert text.endswith("\n\n" + PREVIEW_ADVICE)


def test_one_argument_decoder_one_error_policy():
    from harness.context.calls import call_arguments
    from harness.context.status import tally
    from harness.errors import ConfigError
    from harness.render import to_hermes

    def call(args):
        return {"id": "k", "type": "function", "function": {"name": "read_file", "arguments": args}}

    assert call_arguments(call('{"path": "a"}')) == call_arguments(call({"path": "a"})) == {"path": "a"}
    assert call_arguments(call("")) == call_arguments(call(None)) == {}
    bad = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call('{"path": ')]}]
    guarded = ConditionConfig(loop_guard=LoopGuardConfig())
    users = [lambda: tally(bad, Rule("read_file", "path", 2)), lambda: view(_episode(bad), guarded),
             lambda: active_paths(bad), lambda: to_hermes(bad, [])]
    for use in users:
        with pytest.raises(ConfigError, match=r"tool call k \(read_file\): arguments are not valid JSON"):
            use()
    with pytest.raises(ConfigError, match="trace 7: tool call k"):
        call_arguments(call('"a string"'), "trace 7")


def test_working_set_from_the_workspace_listing_shows_directories_as_directories():
    from harness.context.turn_meta import working_set

    files = ["README.md", "pyproject.toml", "src/app/main.py", "tests/test_app.py", "docs/"]
    msgs = [_call("tests/"), _call("src/app"), _call("/repo/docs"), _call("src/app/main.py")]
    ws = working_set("/repo", files, msgs)
    assert ws.key_files == ("README.md", "pyproject.toml") and ws.top_dirs == ("src", "tests", "docs")
    assert ws.render().split("\n")[2:8] == [
        "Key files: README.md, pyproject.toml", "Top-level directories: src/, tests/, docs/",
        "Active paths (prioritize these):", "- src/app/main.py (file)", "- /repo/docs (directory)", "- src/app (directory)"]
    assert "- tests/ (directory)" in ws.render()


def test_turn_meta_step_every_message_dedup_and_model_from_the_run():
    from dataclasses import replace

    from harness.context import apply
    from harness.run import first_steps
    from tests.conftest import make_cfg

    cfg = make_cfg("scenario=todo_state", "scenario.ask=[current]", "scenario.completed_steps=[1]",
                   "condition=[none,turn_meta]", "model=qwen3-8b")
    plan = first_steps(cfg)
    meta = next(s for s in plan if s.condition == "turn_meta")
    plain = next(s for s in plan if s.condition == "none" and s.episode.id == meta.episode.id)
    assert plain.condition_cfg.turn_meta is None  # set only where shown: other arms keep their ids
    assert plain.condition_cfg.identity() == ConditionConfig().identity()
    users = [m["content"] for m in meta.request.messages if m["role"] == "user"]
    assert all(u.startswith("<turn_meta>\nDate: 2026-01-15\nModel: qwen3-8b (thinking: on)\n") for u in users)
    assert "Key files: CHANGELOG.md\nTop-level directories: src/, tests/\n" in users[-1]
    assert "/ (file)" not in "".join(users)  # a directory is never shown as a file
    # before any call the working set is empty: two user messages with no call between share one block
    ep = meta.episode
    ep2 = replace(ep, messages=ep.messages[:2] + [{"role": "user", "content": "Also keep the changelog."}] + ep.messages[2:])
    out = apply(ep2, ConditionConfig(turn_meta=TurnMetaConfig()))
    assert out[1]["content"].startswith("<turn_meta>") and out[2]["content"] == "Also keep the changelog."
    last = apply(ep2, ConditionConfig(turn_meta=TurnMetaConfig(last_only=True)))
    assert [m["content"].startswith("<turn_meta>") for m in last if m["role"] == "user"] == [False, False, True]
