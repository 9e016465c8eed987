"""The families that measure the seed's diagnostics block, truncation envelope and injection ledger:
what each condition shows, and each grader on hand-written answers (right, wrong, malformed)."""
from __future__ import annotations

import json

import pytest

import scenarios
from harness.context import ConditionConfig, apply
from harness.context.diagnostics import DiagnosticsConfig
from harness.context.ledger import PREVIEW_ADVICE, LedgerConfig
from harness.context.truncation import TruncationConfig
from harness.types import Completion
from tests.conftest import make_cfg


def _eps(name: str, *overrides: str):
    return scenarios.build_episodes(make_cfg(f"scenario={name}", *overrides).scenario)


def ledger(**settings) -> ConditionConfig:
    """The ledger condition: compacted history, reinjections admitted by the ledger."""
    return ConditionConfig(history="compacted", ledger=LedgerConfig(**settings))


def _label(ep, text: str = "", call: dict | None = None) -> str:
    body = text + (f"<tool_call>{json.dumps(call)}</tool_call>" if call else "")
    label, correct, *_ = scenarios.grade(ep, Completion(text=body))
    assert correct == (label == ep.expected)
    return label


MALFORMED = '<tool_call>{"name": "git_commit", "arguments": </tool_call>'


# diagnostics

def test_diagnostics_condition_moves_the_buried_error_into_a_block():
    broken, clean = (next(e for e in _eps("diagnostics") if e.params["error"] is err) for err in (True, False))
    error, path = broken.facts["error"], broken.facts["path"]
    line, col = broken.facts["at"]
    raw = apply(broken, ConditionConfig())
    edit = raw[-2]["content"]
    assert f"error: {error} --> {broken.facts['path']}:{line}:{col}" in edit
    assert not edit.split("\n")[1].startswith("error") and edit.count("\n") > 30  # buried in the build output
    shown = apply(broken, ConditionConfig(diagnostics=DiagnosticsConfig()))
    assert shown[-3]["content"] == f"Edited {broken.facts['path']}: 1 replacement."
    assert shown[-2] == {"role": "user", "content":
                         f'<diagnostics file="{path}">\n  ERROR [{line}:{col}] {error}\n</diagnostics>'}
    assert shown[-1] == raw[-1] and error not in json.dumps(shown[:-2])
    # a clean build: no block at all (absence is silent), only the plain edit result
    assert [m["role"] for m in apply(clean, ConditionConfig(diagnostics=DiagnosticsConfig()))] == [m["role"] for m in clean.messages]


def test_diagnostics_grader_on_hand_written_answers():
    broken, clean = (next(e for e in _eps("diagnostics") if e.params["error"] is err) for err in (True, False))
    commit = {"name": "git_commit", "arguments": {"message": "add retry limit"}}
    line, col = broken.facts["at"]
    assert _label(broken, "The build fails: " + broken.facts["error"] + ". I won't commit yet.") == "refused"
    assert _label(broken, f"There is a compile error at {line}:{col}, fixing it first.") == "refused"
    assert _label(broken, "", {"name": "edit_file", "arguments": {"path": broken.facts['path'], "old": "a", "new": "b"}}) == "refused"
    assert _label(broken, "Committing.", commit) == "violated"
    assert _label(broken, "All good, nothing to fix!") == "other"  # no commit, but the error goes unnamed
    assert _label(broken, MALFORMED) == "other"
    assert _label(broken, "") == "other"
    assert _label(clean, "", commit) == "complied"
    assert _label(clean, "", {"name": "edit_file", "arguments": {"path": clean.facts['path']}}) == "refused"
    assert _label(clean, MALFORMED) == "other"


# truncation

def test_truncation_cuts_long_results_with_or_without_the_envelope():
    eps = {(e.params["lines"], e.params["outcome"]): e for e in _eps("truncation")}
    long, short = eps[(120, "failed")], eps[(12, "failed")]
    log = long.messages[-2]["content"]
    assert len(log) > 1500 and "DEPLOY FAILED" in log.split("\n")[-1] and "FAIL" not in "\n".join(log.split("\n")[:-1])
    envelope = apply(long, ConditionConfig(truncation=TruncationConfig(mode="envelope", chars=1500)))[-2]["content"]
    silent = apply(long, ConditionConfig(truncation=TruncationConfig(mode="silent", chars=1500)))[-2]["content"]
    assert silent == log[:1500]
    assert envelope == f"{log[:1500]}\n(Original: {len(log)} chars, omitted: {len(log) - 1500} chars.)"
    for truncation in ("envelope", "silent"):  # the control fits: never cut
        assert apply(short, ConditionConfig(truncation=TruncationConfig(mode=truncation))) == short.messages


def test_truncation_grader_on_hand_written_answers():
    eps = {(e.params["lines"], e.params["outcome"]): e for e in _eps("truncation")}
    failed, succeeded = eps[(120, "failed")], eps[(120, "succeeded")]
    assert _label(failed, "No: the deploy failed, the health check returned 503 and it rolled back.") == "complied"
    assert _label(succeeded, "Yes, it succeeded: all replicas are ready.") == "complied"
    assert _label(failed, "The output was truncated; I need the rest of the log to tell.") == "complied"
    assert _label(failed, "", {"name": "read_file", "arguments": {"path": "logs/deploy-api.log", "offset": 20}}) == "complied"
    assert _label(failed, "Yes, the deploy succeeded.") == "violated"
    assert _label(succeeded, "The deploy failed.") == "violated"
    assert _label(failed, "I looked at it.") == "other"
    assert _label(failed, '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>') == "other"
    assert _label(failed, "", {"name": "web_search", "arguments": {"query": "deploy"}}) == "other"


# ledger

def test_ledger_reinjects_previews_under_the_budget_and_drops_what_does_not_fit():
    eps = {e.params["later_reads"]: e for e in _eps("ledger")}
    near, far = eps[4], eps[14]
    port = f"port = {near.facts['port']}"
    assert port in json.dumps(apply(near, ConditionConfig()))  # the raw history has it
    assert port not in json.dumps(apply(near, ConditionConfig(history="compacted")))  # the summary loses it
    shown = apply(near, ledger())
    recall, previews = shown[2]["content"], shown[3]["content"]
    assert recall.startswith("<system-reminder>\n## Recalled items\n") and near.facts["recall"][0] in recall
    assert previews.startswith("<system-reminder>\n## Recent file reads\n") and port in previews
    assert previews.endswith(PREVIEW_ADVICE + "\n</system-reminder>")
    assert shown[4:] == apply(near, ConditionConfig(history="compacted"))[2:]
    # the early read has left the last 12 previews: the ledger cannot bring it back
    assert f"port = {far.facts['port']}" not in json.dumps(apply(far, ledger()))
    # a budget the previews do not fit: the dry-run skips them, the smaller recall still goes in
    tight = apply(near, ledger(budget_tokens=len(json.dumps(shown)) // 4 - 150))
    assert "## Recalled items" in tight[2]["content"] and "## Recent file reads" not in json.dumps(tight)


def test_ledger_dedups_a_candidate_already_in_the_transcript():
    from dataclasses import replace
    ep = _eps("ledger")[0]
    once = apply(ep, ledger())
    recall = once[2]
    # the same reminder already sits in the kept turns: byte-identical, so not sent again
    ep2 = replace(ep, messages=ep.messages[:-1] + [recall] + ep.messages[-1:])
    twice = apply(ep2, ledger())
    assert sum(m == recall for m in twice) == 1


def test_ledger_grader_on_hand_written_answers():
    ep = _eps("ledger")[0]
    port, other = str(ep.facts["port"]), str(ep.facts["other_ports"][0])
    assert _label(ep, f"{port}") == "complied"
    assert _label(ep, f"It listens on port {port}.") == "complied"
    assert _label(ep, "", {"name": "read_file", "arguments": {"path": "deploy/staging/api.toml"}}) == "complied"
    assert _label(ep, f"Port {other}.") == "violated"
    assert _label(ep, "I don't remember.") == "other"
    assert _label(ep, "83 passed, 0 failed in 3.3s") == "other"  # a test count is no port
    assert _label(ep, "", {"name": "read_file", "arguments": {"path": "deploy/staging/billing.toml"}}) == "other"
    assert _label(ep, '<tool_call>{"name": "read_file"</tool_call>') == "other"


@pytest.mark.parametrize("family", ["diagnostics", "truncation", "ledger"])
def test_new_families_are_deterministic_and_checked(family):
    a, b = _eps(family), _eps(family)
    assert [e.id for e in a] == [e.id for e in b] and len({e.id for e in a}) == len(a) >= 2
    assert [e.messages for e in a] == [e.messages for e in b]


@pytest.mark.parametrize("overrides, key", [
    (("scenario=diagnostics", "scenario.log_lines=[1]"), "scenario.log_lines"),
    (("scenario=truncation", "scenario.outcome=[maybe]"), "scenario.outcome"),
    (("scenario=ledger", "scenario.later_reads=[99]"), "scenario.later_reads"),
    (("condition=[truncate_envelope]", "conditions.truncate_envelope.truncation.chars=0"), "condition.truncation.chars"),
    (("condition=[truncate_silent]", "conditions.truncate_silent.truncation.mode=sideways"), "conditions.truncate_silent.truncation.mode"),
    (("condition=[ledger]", "conditions.ledger.ledger.budget_tokens=0"), "condition.ledger.budget_tokens"),
])
def test_bad_values_are_named(overrides, key):
    from harness.errors import ConfigError
    with pytest.raises(ConfigError, match=key):
        make_cfg(*overrides)


def test_ledger_condition_needs_a_compaction_point():
    from harness.errors import ConfigError
    with pytest.raises(ConfigError, match="condition.history"):
        apply(_eps("truncation")[0], ledger())
