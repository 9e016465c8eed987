"""CPU linears through oneDNN: every linear of the model goes through the op, with torch's numbers."""
from __future__ import annotations

import pytest
import torch

from harness.engine import linear as cpu_linear


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.skipif(cpu_linear._PACK is None, reason="this torch build has no oneDNN linear")
def test_every_linear_goes_through_onednn_with_torchs_results(monkeypatch):
    model = _tiny_llama()
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        ref = model(input_ids=ids).logits
    calls = []
    op = cpu_linear._OP
    monkeypatch.setattr(cpu_linear, "_OP", lambda *a: calls.append(a[1].is_mkldnn) or op(*a))
    assert cpu_linear.route_linears(model, 8)
    with torch.inference_mode():
        got = model(input_ids=ids).logits
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(calls) == len(linears) == 2 * 7 + 1  # q k v o gate up down per layer, and the lm_head
    assert all(calls)  # with the weights packed at load
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_model_in_a_dtype_without_onednn_kernels_is_left_alone():
    model = _tiny_llama().to(torch.float16)  # routed: float32, and bfloat16 where oneDNN has bf16 kernels
    forwards = [m.forward for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert not cpu_linear.route_linears(model, 8)
    assert forwards == [m.forward for m in model.modules() if isinstance(m, torch.nn.Linear)]
