"""Cost from the presets' prices: cache reads, cache writes and batch prices on hand-computed cases, and
the README's cost table command."""
from __future__ import annotations

import json

import pytest

from harness.measure.cost import cost_usd, price
from harness.tools.costs import priced_models, table
from harness.types import Completion
from tests.conftest import make_cfg


def test_each_prompt_token_is_billed_once_at_its_own_price_and_batches_at_the_discount():
    m = make_cfg("model=claude-opus-5.5").model  # input 4, cache read 0.2, cache write 5, output 20 per 1M
    c = Completion(prompt_tokens=1000, cached_prompt_tokens=600, cache_write_tokens=300, completion_tokens=50)
    assert cost_usd(m, c) == pytest.approx((100 * 4 + 600 * 0.2 + 300 * 5 + 50 * 20) / 1e6)
    c.batched = True
    assert cost_usd(m, c) == pytest.approx((100 * 4 + 600 * 0.2 + 300 * 5 + 50 * 20) / 1e6 * 0.5)
    assert price(m, 1000, 700, 400, 50) is None  # more read and written than the prompt: unknown, not negative
    unpriced = make_cfg("model.price_input_per_mtok=1.0", "model.price_output_per_mtok=2.0").model
    assert price(unpriced, 1000, 0, 0, 10, batched=True) is None  # no batch discount known: unknown
    assert price(unpriced, 1000, 0, 500, 10) == pytest.approx((1000 * 1.0 + 10 * 2.0) / 1e6)  # writes billed as input


def test_the_cost_table_of_a_run(tmp_path):
    rows = [{"sample_id": f"s{i}", "prompt_tokens": p, "created_at": "2026-12-01T00:00:00+00:00"} for i, p in enumerate((1000, 2000))]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = table(tmp_path, ["claude-opus-5.5", "gpt-6-luna"], 500)
    opus = next(line for line in text.splitlines() if line.startswith("| claude-opus-5.5"))
    assert opus.split("|")[-3].strip() == f"{(3000 * 4 + 1000 * 20) / 1e6:.4f}"
    assert opus.split("|")[-2].strip() == f"{(3000 * 4 + 1000 * 20) / 1e6 / 2:.4f}"
    assert "3,000 prompt tokens" in text and "500 output tokens per sample assumed" in text
    assert {"claude-opus-5.5", "claude-haiku-4.5", "gpt-6.2-sol"} <= set(priced_models())
