"""The probe's attention function: exact softmax(qK^T) rows for a chunk of query tokens against the
cached keys, reduced to region sums as soon as they exist.

Registered in transformers' AttentionInterface, so the model's own attention module has already
applied q/k norm, RoPE and the cache update; only chunk x seq scores exist at a time, per layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

NAME = "statusbench_probe"


@dataclass
class Sink:
    """What the attention function accumulates over one sample's completion chunks."""

    key_region: torch.Tensor  # [T] region id of every position, prompt and completion
    phase: torch.Tensor  # [T] 0 thinking / 1 answer, read at the completion positions
    n_regions: int
    masses: torch.Tensor  # [2, layers, heads, regions] float64 sums over query rows
    prompt_len: int
    strip_layer: int
    strip: torch.Tensor  # [prompt_len] float64: sum over heads and rows, at strip_layer
    keep_rows: bool = False  # also keep each row's region masses (tests)
    rows: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> [heads, chunk, regions]
    visits: set[int] = field(default_factory=set)  # layers that ran through this function


def probe_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, probe_sink: Sink | None = None,
                    sliding_window=None, **kwargs):
    if probe_sink is None:
        raise RuntimeError(f"attention implementation {NAME!r} needs probe_sink=Sink(...) in the forward call")
    if sliding_window is not None:
        raise RuntimeError("the attention probe does not handle sliding-window layers")
    sink, layer = probe_sink, module.layer_idx
    b, h, c, d = query.shape
    hkv, k_len = key.shape[1], key.shape[2]
    if b != 1:
        raise RuntimeError("the attention probe runs one sequence at a time")
    # grouped-query attention without copying K/V: query head i reads KV head i // (h // hkv),
    # the order of transformers' repeat_kv
    q = query.float().view(b, hkv, h // hkv, c, d)
    scores = torch.matmul(q, key.float().unsqueeze(2).transpose(-1, -2)) * scaling
    pos = torch.arange(k_len - c, k_len, device=query.device)
    future = torch.arange(k_len, device=query.device)[None, :] > pos[:, None]
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    out = torch.matmul(probs.to(value.dtype), value.unsqueeze(2)).view(b, h, c, d).transpose(1, 2).contiguous()

    probs = probs.view(h, c, k_len)
    onehot = torch.nn.functional.one_hot(sink.key_region[:k_len], sink.n_regions).to(probs.dtype)
    region = torch.matmul(probs, onehot)  # [heads, chunk, regions]
    phase = sink.phase[k_len - c:k_len]
    for p in (0, 1):
        rows = phase == p
        if rows.any():
            sink.masses[p, layer] += region[:, rows].sum(1).double().cpu()
    if layer == sink.strip_layer:
        sink.strip += probs[:, :, :sink.prompt_len].sum((0, 1)).double().cpu()
    if sink.keep_rows:
        sink.rows.setdefault(layer, []).append(region.cpu())
    sink.visits.add(layer)
    return out, None


AttentionInterface.register(NAME, probe_attention)
