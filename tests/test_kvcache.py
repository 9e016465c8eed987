"""The decode batch's preallocated KV cache: the same keys and values as concatenation, written in place."""
from __future__ import annotations

import pytest
import torch

from harness.engine.kvcache import batch_cache


def _kv(tokens: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(1, 2, tokens, 3, generator=g) for _ in (0, 1)) for _ in range(2)]  # 2 layers


def test_rows_are_their_paths_right_aligned_and_steps_append_in_place():
    shared, tail_a, tail_b = _kv(4, 0), _kv(2, 1), _kv(1, 2)
    cache = batch_cache([[shared, tail_a], [shared, tail_b]], new_tokens=2)
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


def test_one_token_decode_attention_equals_transformers_sdpa_with_a_padding_mask():
    """Grouped-query heads read their KV head in place, padded keys stay masked, and what it does not
    handle (a longer query) goes to transformers' own sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from harness.engine.attention import decode_attention

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal, training = 3, True, False

    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, h, 1, 8, generator=g) if h == 6 else torch.randn(2, h, 5, 8, generator=g)
                         for h in (6, 2, 2))
    mask = torch.tensor([[True] * 5, [False, False, True, True, True]])[:, None, None, :]  # row 1 left-padded by 2
    ours, _ = decode_attention(Module(), query, key, value, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.3)
    assert ours.shape == ref.shape == (2, 1, 6, 8)
    torch.testing.assert_close(ours, ref)
    key[1, :, :2] = 1e4  # what sits in the padding does not matter
    torch.testing.assert_close(decode_attention(Module(), query, key, value, mask, scaling=0.3)[0], ref)
    longer = torch.randn(2, 6, 5, 8, generator=g)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    torch.testing.assert_close(decode_attention(Module(), longer, key, value, causal, scaling=0.3)[0],
                               sdpa_attention_forward(Module(), longer, key, value, causal, scaling=0.3)[0])


@pytest.mark.parametrize("groups", [3, 1])  # grouped-query heads, and one query head per KV head
def test_decode_attention_over_shared_runs_equals_attention_over_each_rows_whole_cache(groups):
    """Runs held once for several rows (one alone, two of equal member count stacked with padding) give
    the attention of each row over its concatenated KV; a finished row leaves every run it read."""
    from harness.engine.attention import decode_attention

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal, training = groups, True, False

    root, ep_a, ep_b = _kv(5, 0), _kv(4, 1), _kv(2, 2)
    own = [_kv(1, 3), [], _kv(2, 4), _kv(3, 5)]  # row 1 has no tokens of its own (a replicate of row 0's prompt)
    paths = [[root, ep_a, own[0]], [root, ep_a], [root, ep_b, own[2]], [root, ep_b, own[3]]]
    whole = batch_cache([[torch_cat(p)] for p in paths], new_tokens=2)
    split = batch_cache([[o] if o else [] for o in own], new_tokens=2,
                        shared=[(root, [0, 1, 2, 3]), (ep_a, [0, 1]), (ep_b, [2, 3])])
    assert [len(s.rows) for s in split.layers[0].shared] == [1, 2]  # grouped by member count
    g = torch.Generator().manual_seed(7)
    for step in range(2):
        if step:  # row 2 finished
            for cache in (whole, split):
                cache.batch_select_indices(torch.tensor([0, 1, 3]))
        rows = len(whole.layers[0].keys)
        new_k, new_v, query = (torch.randn(rows, 2, 1, 3, generator=g) for _ in range(3))
        query = torch.randn(rows, 2 * groups, 1, 3, generator=g)
        outs = []
        for cache in (whole, split):
            layer = cache.layers[1]
            key, value = layer.update(new_k, new_v)
            lengths = [int(n) for n in (key.abs().sum((1, 3)) > 0).sum(-1)]  # this test's KV is never exactly 0
            mask = torch.tensor([[float("-inf")] * (key.shape[2] - n) + [0.0] * n for n in lengths])[:, None, None, :]  # additive, as eager_mask builds it
            outs.append(decode_attention(Module(), query, key, value, mask, scaling=0.5)[0])
        torch.testing.assert_close(outs[1], outs[0])
    assert [s.rows.tolist() for s in split.layers[1].shared] == [[[0, 1, 3, 2]], [[0, 1], [3, 2]]]  # 3: the dropped slot
    with pytest.raises(RuntimeError, match="shared KV runs"):  # a longer query would miss the shared keys
        decode_attention(Module(), torch.randn(3, 2 * groups, 2, 3), key, value, None, scaling=0.5)


def test_shared_runs_only_where_masks_depend_on_padding_alone():
    from types import SimpleNamespace

    from transformers import LlamaConfig, MistralConfig, Qwen3Config

    from harness.engine.decode import _padding_only_masks

    assert _padding_only_masks(SimpleNamespace(config=LlamaConfig()))
    assert _padding_only_masks(SimpleNamespace(config=Qwen3Config()))  # its window is off by default
    assert not _padding_only_masks(SimpleNamespace(config=MistralConfig(sliding_window=4096)))
    assert not _padding_only_masks(SimpleNamespace(config=Qwen3Config(use_sliding_window=True, sliding_window=64, max_window_layers=0)))


def torch_cat(runs):
    return [tuple(torch.cat([r[layer][j] for r in runs], dim=-2) for j in (0, 1)) for layer in range(len(runs[0]))]


def test_decode_batches_are_cut_by_rows_and_by_kv_positions():
    from harness.engine.decode import _batches
    from harness.engine.prefix import PrefixNode

    order = [(i, PrefixNode(0, [0] * n)) for i, n in enumerate([10, 10, 30, 10, 50])]
    cut = lambda rows, positions: [[i for i, _ in chunk] for chunk in _batches(order, rows, 2, positions)]  # noqa: E731
    assert cut(64, float("inf")) == [[0, 1, 2, 3, 4]]
    assert cut(2, float("inf")) == [[0, 1], [2, 3], [4]]
    # rows x (longest prompt + 2 new tokens): 2 x 12 fits 40, adding the 30-token row makes 3 x 32;
    # the 50-token row is over 40 on its own and is still decoded, alone
    assert cut(64, 40) == [[0, 1], [2], [3], [4]]
    assert cut(64, 100) == [[0, 1, 2], [3], [4]]  # 3 x 32 = 96 fits; 4 x 32 does not, nor 2 x 52


@pytest.mark.parametrize("groups, past", [(3, 7), (1, 7), (3, 0)])  # grouped-query heads or not; a chunk with nothing before it
def test_a_prefill_chunk_attends_as_transformers_sdpa_with_a_causal_mask_over_the_whole_cache(groups, past):
    """A chunk of queries that are the cache's last positions (a prefill cache, `prefill_cache`): the keys
    before it whole, the chunk causally, merged; the same as transformers' sdpa with the causal mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from harness.engine.attention import decode_attention
    from harness.engine.kvcache import prefill_cache

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal, training = groups, True, False

    g = torch.Generator().manual_seed(0)
    n, d = 5, 3  # _kv's head dim
    before = [_kv(past, 1)] if past else []
    cache = prefill_cache(before, n, layers=2, like=torch.empty(1, 2, 0, d))
    new_k, new_v = torch.randn(1, 2, n, d, generator=g), torch.randn(1, 2, n, d, generator=g)
    key, value = cache.layers[0].update(new_k, new_v)
    assert key.shape == (1, 2, past + n, d) and key.causal_chunk
    query = torch.randn(1, n, 2 * groups, d, generator=g).transpose(1, 2)  # as the models lay it out
    causal = torch.ones(n, past + n, dtype=torch.bool).tril(past)[None, None]
    ours, _ = decode_attention(Module(), query, key, value, None, scaling=0.3)
    ref, _ = sdpa_attention_forward(Module(), query, key, value, causal, scaling=0.3)
    torch.testing.assert_close(ours, ref)
