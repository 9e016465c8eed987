"""A decode batch's KV cache in preallocated buffers (imported lazily: it imports transformers).

transformers' DynamicLayer appends each step's keys and values with torch.cat, copying the whole
cache of every layer at every step; for a batch of long prompts that copy costs more than the step.
Here each row's own prompt KV is written once into buffers with room for the new tokens, and each
step writes one column in place.

KV runs that several rows share (a family's system prompt, an episode's history under two arms) can
stay out of the rows' buffers: `SharedKV` holds them once, with the rows that read them, and
`harness.engine.attention` attends to them once for all those rows. A decode step's attention
reads every row's cache whole, so a prefix read once instead of once per row is that much less to read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv heads, tokens, head dim]


@dataclass
class SharedKV:
    """One layer's KV runs that the same number of batch rows each attend to, stacked: run i is read by
    the batch rows rows[i] (a finished row's entry becomes the batch size: a slot whose result is dropped)."""

    keys: torch.Tensor  # [runs, kv heads, longest run, head dim], right-padded
    values: torch.Tensor
    bias: torch.Tensor | None  # [runs, 1, 1, longest run]: 0 on a run's tokens, -inf on its padding; None: no padding
    rows: torch.Tensor  # [runs, members]


class GrowInPlaceLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of the first `length` positions of buffers,
    and whose keys carry the layer's shared runs to the attention function (`keys.shared_kv`):
    transformers hands what `update` returns straight to it, so no model code is patched."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int, shared: list[SharedKV], causal: bool = False):
        """`causal`: the layer of a prefill, whose queries are always its last positions, each attending
        to every position before it (`keys.causal_chunk` tells the attention function so)."""
        super().__init__()
        self.bufs, self.length, self.shared, self.causal = (keys, values), length, shared, causal
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._view()

    def _view(self) -> None:
        self.keys, self.values = (b[:, :, :self.length] for b in self.bufs)
        self.keys.shared_kv = self.shared
        self.keys.causal_chunk = self.causal

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self.bufs[0].shape[-2]:
            raise RuntimeError(f"preallocated KV cache full: {end} > {self.bufs[0].shape[-2]} positions")
        for buf, new in zip(self.bufs, (key_states, value_states)):
            buf[:, :, self.length:end] = new
        self.length = end
        self._view()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        before, rows = len(self.bufs[0]), len(indices)
        self.bufs = tuple(b[indices] for b in self.bufs)
        moved = torch.full((before + 1,), rows, dtype=torch.long, device=indices.device)
        moved[indices] = torch.arange(rows, device=indices.device)  # old batch position -> new one, or the dropped slot
        self.shared = [SharedKV(s.keys, s.values, s.bias, moved[s.rows]) for s in self.shared]
        self.shared = [s for s in self.shared if bool((s.rows < rows).any())]  # a run nobody reads any more goes
        self._view()


def batch_cache(rows: list[list[KV]], new_tokens: int, shared: Sequence[tuple[KV, list[int]]] = ()) -> DynamicCache:
    """The cache of a left-padded batch: row r holds the concatenation of its KV runs rows[r],
    right-aligned at the longest row, with room for `new_tokens` more positions; padding is zero (it
    is masked). `shared`: runs read by several rows, each with its rows' batch positions, held once
    (grouped by member count into `SharedKV`s); the batch reads them in addition to its own runs."""
    lengths = [sum(run[0][0].shape[-2] for run in runs) for runs in rows]
    width = max(lengths)
    groups: dict[int, list[tuple[KV, list[int]]]] = {}
    for run, members in shared:
        groups.setdefault(len(members), []).append((run, members))
    template = ([run for runs in rows for run in runs] + [run for run, _ in shared])[0]  # shapes and dtype
    cache = DynamicCache()
    cache.layers = []
    for layer, (k0, _) in enumerate(template):
        # uninitialised but for the padding: the room for new tokens is written before it is read
        bufs = [k0.new_empty((len(rows), k0.shape[1], width + new_tokens, k0.shape[3])) for _ in (0, 1)]
        for r, runs in enumerate(rows):
            at = width - lengths[r]
            for buf in bufs:  # masked, but masked garbage can be NaN, and NaN x 0 weight is NaN
                buf[r, :, :at] = 0
            for run in runs:
                n = run[layer][0].shape[-2]
                for buf, part in zip(bufs, run[layer]):
                    buf[r, :, at:at + n] = part[0]
                at += n
        cache.layers.append(GrowInPlaceLayer(*bufs, width, [_stack(group, layer) for group in groups.values()]))
    return cache


def prefill_cache(past: list[KV], new_tokens: int, layers: int, like: torch.Tensor) -> DynamicCache:
    """The cache a run of prompt tokens is prefilled in: the KV runs before it (`past`, root first)
    copied once into buffers with room for its `new_tokens`, which each chunk writes in place, where
    transformers' DynamicCache concatenates the whole cache again at every chunk. `like`: a tensor
    [1, kv heads, any, head dim] of the cache's dtype and device, for a run with nothing before it."""
    length = sum(run[0][0].shape[-2] for run in past)
    cache = DynamicCache()
    cache.layers = []
    for layer in range(layers):
        bufs = [like.new_empty((1, like.shape[1], length + new_tokens, like.shape[3])) for _ in (0, 1)]
        at = 0
        for run in past:
            n = run[layer][0].shape[-2]
            for buf, part in zip(bufs, run[layer]):
                buf[:, :, at:at + n] = part
            at += n
        cache.layers.append(GrowInPlaceLayer(*bufs, length, [], causal=True))
    return cache


def _stack(group: list[tuple[KV, list[int]]], layer: int) -> SharedKV:
    rows = torch.tensor([members for _, members in group], device=group[0][0][layer][0].device)
    if len(group) == 1:  # one run: the prefill's own tensors, no copy
        keys, values = group[0][0][layer]
        return SharedKV(keys, values, None, rows)
    sizes = [run[layer][0].shape[-2] for run, _ in group]
    k0 = group[0][0][layer][0]
    keys, values = (k0.new_zeros((len(group), k0.shape[1], max(sizes), k0.shape[3])) for _ in (0, 1))
    bias = k0.new_zeros((len(group), 1, 1, max(sizes)))
    for i, ((run, _), n) in enumerate(zip(group, sizes)):
        keys[i, :, :n], values[i, :, :n] = run[layer][0][0], run[layer][1][0]
        bias[i, ..., n:] = float("-inf")
    return SharedKV(keys, values, bias, rows)
