"""CPU linears through oneDNN: every linear of the model goes through the op, with torch's numbers."""
from __future__ import annotations

import pytest
import torch

from harness.engine import linear as cpu_linear


def _tiny_llama(**cfg):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, **cfg)
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
    assert not any("weight" in m._parameters for m in linears)  # the packed copy replaces each: one copy in memory


@pytest.mark.skipif(cpu_linear._PACK is None, reason="this torch build has no oneDNN linear")
def test_an_lm_head_tied_to_the_embedding_keeps_its_weight():
    model = _tiny_llama(tie_word_embeddings=True)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        ref = model(input_ids=ids).logits
    assert cpu_linear.route_linears(model, 8)
    assert model.lm_head.weight is model.model.embed_tokens.weight and "weight" not in model.model.layers[0].mlp.up_proj._parameters
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=1e-5, atol=1e-5)


def test_a_model_in_a_dtype_without_onednn_kernels_is_left_alone():
    model = _tiny_llama().to(torch.float16)  # routed: float32, and bfloat16 where oneDNN has bf16 kernels
    forwards = [m.forward for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert not cpu_linear.route_linears(model, 8)
    assert forwards == [m.forward for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _resident_bytes(t: torch.Tensor) -> int:
    """Resident memory of the mapping that holds `t` (/proc/self/smaps)."""
    from pathlib import Path

    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= t.data_ptr() < hi
        elif inside and head == "Rss:":
            return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the tensor")


@pytest.mark.skipif(not cpu_linear._file_mappings(), reason="no /proc/self/maps")
def test_a_memory_mapped_weights_pages_leave_memory_and_are_read_again_from_the_file(tmp_path):
    import mmap

    data = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    path = tmp_path / "weights.bin"
    path.write_bytes(data.numpy().tobytes())
    with open(path, "rb") as fh:  # as transformers maps a safetensors file: private, read from the file
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    weight = torch.frombuffer(mapped, dtype=torch.float32)
    assert torch.equal(weight, data) and _resident_bytes(weight) >= 4 << 20  # every page read in
    cpu_linear._release(weight, cpu_linear._file_mappings())
    assert _resident_bytes(weight) == 0
    assert torch.equal(weight, data)  # nothing lost: touched again, the pages come from the file
    anonymous = data.clone()
    cpu_linear._release(anonymous, cpu_linear._file_mappings())  # not a file's: left alone
    assert torch.equal(anonymous, data)
