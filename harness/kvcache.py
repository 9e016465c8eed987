"""A decode batch's KV cache in preallocated buffers (imported lazily: it imports transformers).

transformers' DynamicLayer appends each step's keys and values with torch.cat, copying the whole
cache of every layer at every step; for a batch of long prompts that copy costs more than the step.
Here each row's prompt KV is written once into buffers with room for the new tokens, and each step
writes one column in place."""
from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv heads, tokens, head dim]


class GrowInPlaceLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of the first `length` positions of buffers."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.bufs, self.length = (keys, values), length
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._view()

    def _view(self) -> None:
        self.keys, self.values = (b[:, :, :self.length] for b in self.bufs)

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
        self.bufs = tuple(b[indices] for b in self.bufs)
        self._view()


def batch_cache(paths: list[list[KV]], spans: list[list[tuple[int, int]]], new_tokens: int) -> DynamicCache:
    """The cache of a left-padded batch: row r is the concatenation of the KV runs paths[r], which
    cover positions spans[r] (consecutive, from 0), right-aligned at the longest row, with room for
    `new_tokens` more positions. Padding is zero (it is masked)."""
    width = max(r[-1][1] for r in spans)
    cache = DynamicCache()
    cache.layers = []
    for layer, (k0, v0) in enumerate(paths[0][0]):
        # uninitialised but for the padding: the room for new tokens is written before it is read
        bufs = [t.new_empty((len(paths), t.shape[1], width + new_tokens, t.shape[3])) for t in (k0, v0)]
        for r, (runs, run_spans) in enumerate(zip(paths, spans)):
            pad = width - run_spans[-1][1]
            for buf in bufs:  # masked, but masked garbage can be NaN, and NaN x 0 weight is NaN
                buf[r, :, :pad] = 0
            for kv, (start, end) in zip(runs, run_spans):
                for buf, part in zip(bufs, kv[layer]):
                    buf[r, :, pad + start:pad + end] = part[0]
        cache.layers.append(GrowInPlaceLayer(*bufs, width))
    return cache
