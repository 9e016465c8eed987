"""The template compatibility matrix over the shipped real chat templates (../shared/templates)."""
from __future__ import annotations

import pandas as pd
import pytest

from harness.tools import templates
from tests.conftest import REPO

DIR = templates.DEFAULT_DIR
pytestmark = pytest.mark.skipif(not DIR.is_dir(), reason=f"shared templates not found at {DIR}")


@pytest.fixture(scope="module")
def episodes():
    return templates.sample_episodes()


@pytest.fixture(scope="module")
def df(episodes):
    return templates.matrix(DIR, episodes)


def _template(name: str) -> str:
    return (DIR / f"{name}.jinja").read_text()


def test_qwen3_renders_a_mid_conversation_system_message_in_place(episodes):
    messages, tools, status = templates.probes(episodes["xfinity"])["system_mid"]
    text = templates.render(_template("Qwen-Qwen3-0.6B"), messages, tools)
    question = messages[-1]["content"]
    block = f"<|im_start|>system\n{status}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>"
    assert block in text
    assert text.index(messages[-3]["content"]) < text.index(block)  # after the turn sent before it
    assert text.count("<|im_start|>system") == 2


def test_known_facts_in_the_matrix(df):
    assert df.loc["Qwen-Qwen3-0.6B", "system_mid"] == "ok"
    assert df.loc["google-gemma-2-2b-it", "tail_user_status"] == "error: System role not supported"
    assert df.loc["google-gemma-2-2b-it", "system_mid"] == "error: System role not supported"
    # gpt-oss turns only messages[0] into the developer block; a later system message vanishes silently
    assert df.loc["openai-gpt-oss-120b", "system_mid"] == "dropped"
    assert df.loc["Mistral-Small-3.2-24B-Instruct-2506", "consecutive_user"].startswith(
        "error: After the optional system message, conversation roles must alternate")


def test_matrix_covers_every_template_and_registered_condition(df):
    assert sorted(df.index) == sorted(p.stem for p in DIR.glob("*.jinja"))
    for name in sorted(p.stem for p in (REPO / "conf" / "condition").glob("*.yaml")):  # every condition preset
        assert any(c == f"condition:{name}" or c.startswith(f"condition:{name}@") for c in df.columns), name
    assert {"tail_user_status", "system_mid", "consecutive_user", "tool_messages"} <= set(df.columns)
    assert df.loc["Qwen-Qwen3-0.6B", "tool_messages"] == "ok"


def test_cli_writes_csv_and_markdown(tmp_path, capsys):
    templates.main([str(DIR), "--out", str(tmp_path)])
    saved = pd.read_csv(tmp_path / "matrix.csv", index_col=0)
    assert saved.loc["google-gemma-2-2b-it", "system_mid"] == "error: System role not supported"
    md = (tmp_path / "matrix.md").read_text()
    assert md.startswith("| template") and "Qwen-Qwen3-0.6B" in md
    assert "matrix.csv" in capsys.readouterr().out
