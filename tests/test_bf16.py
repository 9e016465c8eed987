"""bfloat16 on a CPU: the decode engine (oneDNN linears, shared-KV attention merged in float32) against
transformers' own generate in bfloat16, and the backend saying which linear path it took."""
from __future__ import annotations

import pytest
import torch

from harness.engine import decode as engine
from harness.engine import linear as cpu_linear
from harness.engine.kvcache import batch_cache
from harness.types import GenerationSettings
from tests.conftest import make_cfg

BF16_LINEAR = cpu_linear._PACK is not None and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # a wide initialisation: peaked logits, so a greedy choice is not a near-tie that bf16 rounding flips
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, initializer_range=0.2, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.skipif(not BF16_LINEAR, reason="no oneDNN bf16 linear on this CPU")
def test_bf16_engine_decodes_transformers_greedy_tokens(monkeypatch):
    """Prompts sharing a 40-token prefix, decoded by the engine with the shared run held once (the
    cascade) and linears through oneDNN, give the tokens of transformers' generate, prompt by prompt."""
    ref_model, model = _tiny_llama(), _tiny_llama()
    assert cpu_linear.route_linears(model, 8)
    monkeypatch.setattr(engine, "SHARED_MIN_POSITIONS", 1)  # the shared prefix read once per step, merged by lse
    g = torch.Generator().manual_seed(1)
    base = torch.randint(1, 96, (40,), generator=g).tolist()
    prompts = [base + torch.randint(1, 96, (n,), generator=g).tolist() for n in (1, 3, 6, 2)]
    gen = GenerationSettings(max_new_tokens=12)
    decoded = engine.PrefixDecoder(model, set(), "cpu").decode(prompts, gen, [0] * 4, batch_size=4, share_prefix=True)
    for p, d in zip(prompts, decoded):
        with torch.inference_mode():
            ref = ref_model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert d.tokens == ref[0, len(p):].tolist()


def _kv(tokens: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(1, 2, tokens, 8, generator=g).bfloat16() for _ in (0, 1)) for _ in range(2)]


def test_bf16_shared_kv_cascade_matches_attention_over_each_rows_whole_cache():
    """In bf16, attention over shared runs merged by log-sum-exp equals one sdpa call over each row's
    concatenated KV within bf16 rounding, and comes back in bf16."""
    from harness.engine.attention import decode_attention

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal, training = 3, True, False

    root, tail_a, tail_b = _kv(300, 0), _kv(40, 1), _kv(7, 2)
    paths = [[root, tail_a], [root, tail_b], [root]]
    whole = batch_cache([[[tuple(torch.cat([r[layer][j] for r in p], dim=-2) for j in (0, 1)) for layer in range(2)]]
                         for p in paths], new_tokens=1)
    split = batch_cache([[tail_a], [tail_b], []], new_tokens=1, shared=[(root, [0, 1, 2])])
    g = torch.Generator().manual_seed(3)
    new_k, new_v = (torch.randn(3, 2, 1, 8, generator=g).bfloat16() for _ in (0, 1))
    query = torch.randn(3, 6, 1, 8, generator=g).bfloat16()
    outs = []
    for cache in (whole, split):
        key, value = cache.layers[1].update(new_k, new_v)
        lengths = [int(n) for n in (key.abs().sum((1, 3)) > 0).sum(-1)]  # random KV is never exactly 0
        mask = torch.tensor([[float("-inf")] * (key.shape[2] - n) + [0.0] * n for n in lengths])[:, None, None, :]
        outs.append(decode_attention(Module(), query, key, value, mask.bfloat16(), scaling=0.35)[0])
    assert outs[1].dtype == torch.bfloat16
    torch.testing.assert_close(outs[1], outs[0], rtol=1.6e-2, atol=1e-2)  # bf16's own tolerance in torch.testing


@pytest.mark.model
def test_describe_names_the_linear_path(monkeypatch):
    from harness.backends import make_backend

    cfg = make_cfg("backend.dtype=bfloat16", "backend.threads=1")
    backend = make_backend(cfg.model, cfg.backend)
    assert backend.describe()["dtype"] == "torch.bfloat16"
    assert backend.describe()["linear"] == ("onednn" if BF16_LINEAR else "torch")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)  # a CPU without bf16 kernels
    assert make_backend(cfg.model, cfg.backend).describe()["linear"] == "torch"
