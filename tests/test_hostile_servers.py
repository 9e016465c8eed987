"""The openai backend against a hostile server on loopback: a 200 that is not a chat completion is
an error record for that sample only (the batch's other answers are kept), a body trickling in is
cut at the overall deadline, and a key the server echoes is redacted before anything stores it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.openai_api import OpenAIBackend
from harness.run import first_steps
from tests.conftest import REPO, TEST_MODEL, make_cfg
from tests.fault_server import FaultServer

SECRET = "sk-statusbench-hostile-9c2d4e6f8a"
GRID = [TEST_MODEL, "scenario.calls_made=[2,3,4]", "scenario.placement=[early,late]", "scenario.episodes_per_cell=1"]


def _generate(server: FaultServer, monkeypatch, *overrides: str):
    monkeypatch.setenv("STATUSBENCH_TEST_KEY", SECRET)
    cfg = make_cfg("backend=openai", f"backend.base_url={server.base_url}", "backend.api_key_env=STATUSBENCH_TEST_KEY",
                   "backend.max_retries=0", "backend.timeout_s=2", "backend.concurrency=4", *GRID, *overrides)
    plan = first_steps(cfg)
    return OpenAIBackend(cfg.model, cfg.backend).generate([s.request for s in plan])


@pytest.mark.parametrize("fate, reason", [("html", "not a chat completion"), ("null_message", "has no message")])
def test_a_malformed_200_fails_only_its_sample(monkeypatch, fate, reason):
    with FaultServer(seed=5, fates={"ok": 0.5, fate: 0.5}) as server:
        completions = _generate(server, monkeypatch)
    assert server.served[fate] and server.served["ok"]
    errors = [c for c in completions if c.error]
    assert len(errors) == server.served[fate] and all(reason in c.error for c in errors), errors[0].error
    ok = [c for c in completions if not c.error]
    assert len(ok) == server.served["ok"] and all(c.text and c.prompt_tokens is not None for c in ok)


def test_a_streamed_html_200_is_an_error_not_an_empty_answer(monkeypatch):
    with FaultServer(seed=5, fates={"html": 1.0}) as server:
        completions = _generate(server, monkeypatch, "backend.stream=true", "scenario.calls_made=[3]")
    assert all(c.error and "no chat completion chunks" in c.error for c in completions), completions[0]


def test_a_trickling_body_ends_at_the_overall_deadline(monkeypatch):
    # one byte every 0.3 s keeps every read under timeout_s; only the overall deadline ends the request
    with FaultServer(fates={"trickle": 1.0}, trickle_s=0.3) as server:
        completions = _generate(server, monkeypatch, "backend.timeout_s=1", "backend.max_retries=1",
                                "scenario.calls_made=[3]", "scenario.placement=[early]")
    assert completions and all("deadline of 2 s" in c.error for c in completions), completions[0].error
    # the whole answer (~300 bytes) would have taken ~90 s; the deadline cut it far sooner
    assert all(c.latency_s < 30 for c in completions)


def test_an_echoed_key_is_redacted_everywhere(tmp_path: Path):
    env = {**os.environ, "STATUSBENCH_TEST_KEY": SECRET}
    with FaultServer(seed=2, fates={"ok": 0.5, "echo_key": 0.5}) as server:
        res = subprocess.run([sys.executable, "-m", "harness.run", "backend=openai", f"backend.base_url={server.base_url}",
                              "backend.api_key_env=STATUSBENCH_TEST_KEY", "backend.max_retries=0", f"run.root={tmp_path}",
                              *GRID], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert server.served["echo_key"]
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    records = next(p for p in written if p.name == "records.jsonl").read_text()
    assert "Invalid header: Bearer [redacted]" in records  # the error is kept, its key is not
    assert any(p.name == "report.html" for p in written)
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in res.stdout + res.stderr


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": float("inf"), "completion_tokens": 3},
    {"prompt_tokens": float("nan"), "completion_tokens": 3},
    {"prompt_tokens": 5, "completion_tokens": -1},
    {"prompt_tokens": 5, "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 4}},
])
def test_impossible_token_counts_are_unknown(usage):
    from openai.types import CompletionUsage

    from harness.backends.openai_wire import to_completion

    c = to_completion("hi", "", [], CompletionUsage.construct(**usage), "stop", 0.1, None)
    assert c.text == "hi" and not c.error  # the answer is kept, its counts are not guessed
    assert (c.prompt_tokens, c.completion_tokens, c.thinking_tokens, c.answer_tokens) == (None, None, None, None)
