"""The decode batch's preallocated KV cache: the same keys and values as concatenation, written in place."""
from __future__ import annotations

import torch

from harness.kvcache import batch_cache


def _kv(tokens: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(1, 2, tokens, 3, generator=g) for _ in (0, 1)) for _ in range(2)]  # 2 layers


def test_rows_are_their_paths_right_aligned_and_steps_append_in_place():
    shared, tail_a, tail_b = _kv(4, 0), _kv(2, 1), _kv(1, 2)
    cache = batch_cache([[shared, tail_a], [shared, tail_b]], [[(0, 4), (4, 6)], [(0, 4), (4, 5)]], new_tokens=2)
    for layer in range(2):
        for j, got in enumerate((cache.layers[layer].keys, cache.layers[layer].values)):
            assert got.shape == (2, 2, 6, 3)
            assert torch.equal(got[0], torch.cat([shared[layer][j], tail_a[layer][j]], dim=-2)[0])
            assert torch.equal(got[1, :, 1:], torch.cat([shared[layer][j], tail_b[layer][j]], dim=-2)[0])
            assert torch.equal(got[1, :, :1], torch.zeros(2, 1, 3))  # left padding
    buffer = cache.layers[0].bufs[0]
    new = torch.ones(2, 2, 1, 3)
    keys, _ = cache.layers[0].update(new, new)
    assert keys.shape[-2] == 7 and torch.equal(keys[:, :, -1:], new)
    assert keys.data_ptr() == buffer.data_ptr()  # a view of the buffer: nothing was reallocated
    cache.layers[0].batch_select_indices(torch.tensor([1]))
    assert torch.equal(cache.layers[0].keys[0, :, -1:], new[1])
    cache.layers[0].update(new[:1], new[:1])
    try:
        cache.layers[0].update(new[:1], new[:1])
    except RuntimeError as exc:
        assert "cache full" in str(exc)
    else:
        raise AssertionError("a write past the buffer must fail")
