"""The run's bar moves per sample a backend reports, and by the rest when its call returns."""
from __future__ import annotations

import pytest

from harness import progress


def test_reported_samples_move_the_bar_as_they_finish_and_the_rest_at_the_end():
    moves: list[int] = []
    with progress.reporting(moves.append, 5):
        progress.advance()
        progress.advance(2)
        assert moves == [1, 2]
    assert moves == [1, 2, 2]
    progress.advance()  # outside a call: nowhere to report, no error
    assert moves == [1, 2, 2]


def test_a_backend_that_reports_nothing_moves_the_bar_once_per_call():
    moves: list[int] = []
    with progress.reporting(moves.append, 3):
        pass
    assert moves == [3]


def test_a_failed_call_moves_nothing_more():
    moves: list[int] = []
    with pytest.raises(ValueError), progress.reporting(moves.append, 3):
        progress.advance()
        raise ValueError
    assert moves == [1]


# --- the decode engine moves the bar per prefill chunk and per decode step ------------------------

def _tiny_decoder():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.engine.decode import PrefixDecoder

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).eval()
    return PrefixDecoder(model, eos_ids=set(), device="cpu")  # no stop token: every row decodes max_new_tokens


def test_the_bar_moves_per_prefill_chunk_and_per_decode_step_by_its_share_of_the_tokens(monkeypatch):
    from harness.engine import decode
    from harness.types import GenerationSettings

    monkeypatch.setattr(decode, "PREFILL_CHUNK", 100)
    shared = [i % 60 for i in range(250)]
    prompts = [shared + [1, 2, 3], shared + [4, 5]]  # a 250-token shared node, then 3 and 2 tokens of their own
    gen = GenerationSettings(max_new_tokens=4, temperature=0.0)
    moves: list[float] = []
    with progress.reporting(moves.append, len(prompts)):
        decoded = _tiny_decoder().decode(prompts, gen, [0, 0], batch_size=8, share_prefix=True)
    assert [len(d.tokens) for d in decoded] == [4, 4]
    per_token = 2 / (250 + 3 + 2 + 2 * 4)  # two samples over the tokens to prefill and to decode
    # prefill: the shared node in chunks of 100, 100, 50 (once), each arm's own tokens; then 4 decode
    # steps of both rows, one token each
    expected = [100, 100, 50, 3, 2] + [2] * 4
    assert moves == pytest.approx([n * per_token for n in expected])
    assert sum(moves) == pytest.approx(2)


def test_a_row_that_stops_early_credits_its_unused_tokens_at_that_step():
    import torch

    from harness.types import GenerationSettings

    decoder = _tiny_decoder()
    prompt = [5, 6, 7]
    with torch.inference_mode():
        first = int(decoder.model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
    decoder.eos_ids = {first}  # greedy: the first token generated stops the row
    moves: list[float] = []
    with progress.reporting(moves.append, 1):
        [d] = decoder.decode([prompt], GenerationSettings(max_new_tokens=10, temperature=0.0), [0],
                             batch_size=8, share_prefix=True)
    assert (d.tokens, d.finish) == ([first], "stop")
    per_token = 1 / (3 + 10)
    assert moves == pytest.approx([3 * per_token, 10 * per_token])  # the prompt, then the row's whole budget


def test_chunked_prefill_gives_the_unchunked_logits(monkeypatch):
    from harness.engine import decode
    from harness.engine.prefix import PrefixNode

    decoder = _tiny_decoder()
    tokens = [i % 50 for i in range(230)]
    stores = []
    for chunk in (10_000, 64):
        monkeypatch.setattr(decode, "PREFILL_CHUNK", chunk)
        node = PrefixNode(0, tokens)
        decoder._prefill([node], {id(node)}, progress.Work(1, len(tokens)))
        stores.append((node.kv, node.logits))
    (kv_whole, logits_whole), (kv_chunked, logits_chunked) = stores
    import torch

    torch.testing.assert_close(logits_chunked, logits_whole, rtol=1e-5, atol=1e-5)
    for (k1, v1), (k2, v2) in zip(kv_whole, kv_chunked):
        assert k1.shape == k2.shape == (1, 2, 230, 8)
        torch.testing.assert_close(k2, k1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v2, v1, rtol=1e-5, atol=1e-5)
