"""Prefix trees (pure) and the hf backend's shared-prefix decoding against the naive one-sample loop and a cold cache."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import progress
from harness.engine.prefix import PrefixTree, prefix_order
from harness.run import first_steps
from tests.conftest import make_cfg

TINY = ["scenario.calls_made=[2,3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
        "scenario.distractor_turns=[0]", "model.generation.max_new_tokens=8", "experiment.replicates=2",
        "backend.threads=1"]  # one thread: on a shared CPU, two threads per process oversubscribe it


def _tree(seqs):
    tree = PrefixTree()
    return tree, [tree.insert(s) for s in seqs]


def test_tree_of_two_arms_and_replicates():
    system, arm_a, arm_b = [1, 2, 3], [4, 5], [4, 6, 7]
    tree, ends = _tree([system + arm_a, system + arm_a, system + arm_b, [9]])
    assert [r.tokens for r in tree.roots.values()] == [[1, 2, 3, 4], [9]]
    shared = tree.roots[1]
    assert [c.tokens for c in shared.children.values()] == [[5], [6, 7]]
    assert ends[0] is ends[1] is shared.children[5]  # replicates end at one node
    assert ends[2].path() == [shared, shared.children[6]]


def test_a_prompt_that_is_a_prefix_of_another_ends_inside_the_tree():
    tree, (longer, shorter) = _tree([[1, 2, 3], [1, 2]])
    assert shorter.tokens == [1, 2] and longer.tokens == [3] and longer.parent is shorter
    assert tree.insert([1, 2, 3]) is longer  # a node a sequence ended at stays its end when split


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="at least one token"):
        PrefixTree().insert([])


seqs_strategy = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12)


@given(seqs_strategy)
def test_every_sequence_is_the_concatenation_of_its_path(seqs):
    tree, ends = _tree(seqs)
    for s, end in zip(seqs, ends):
        assert sum((n.tokens for n in end.path()), []) == s and all(n.tokens for n in end.path())
        assert all(n.start == sum(len(m.tokens) for m in end.path()[:k]) for k, n in enumerate(end.path()))
        assert tree.insert(s) is end
    # no token is computed twice: the tree holds exactly the distinct prefixes
    assert sum(len(n.tokens) for n in tree.nodes()) == len({tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)})
    assert [tuple(seqs[i]) for i in prefix_order(seqs)] == sorted(map(tuple, seqs))


def _kv(tokens: list[int]) -> list[tuple]:
    """Fake one-layer KV whose values are the token ids, to see which positions a node holds."""
    import torch

    t = torch.tensor(tokens, dtype=torch.float32)[None, None, :, None]
    return [(t.clone(), t.clone())]


def test_a_split_node_splits_its_kv_and_keeps_its_logits_at_the_end():
    tree = PrefixTree()
    end = tree.insert([1, 2, 3, 4])
    end.kv, end.logits = _kv([1, 2, 3, 4]), "logits"
    other = tree.insert([1, 2, 9])
    head = other.parent
    assert head.tokens == [1, 2] and end.parent is head and end.tokens == [3, 4] and other.kv is None
    assert head.kv[0][0].flatten().tolist() == [1, 2] and end.kv[0][1].flatten().tolist() == [3, 4]
    assert (head.logits, end.logits) == (None, "logits")
    found = tree.match([1, 2, 3, 7])
    assert [(n.tokens, k) for n, k in found] == [([1, 2], 2), ([3, 4], 1)]


def test_eviction_drops_least_recently_used_leaves_first_and_never_a_pinned_path():
    tree = PrefixTree()
    nodes = {}
    for name, seq in {"a": [1, 2, 3], "b": [1, 2, 4], "c": [5, 6]}.items():
        tree.tick()
        nodes[name] = tree.insert(seq)
        tree.hold(nodes[name], 1)
        for n in nodes[name].path():
            if n.kv is None:
                n.kv = _kv(n.tokens)
        tree.hold(nodes[name], -1)
    per_token = 8  # keys and values, 4 bytes each
    assert tree.nbytes() == 6 * per_token  # [1, 2], [3], [4], [5, 6]
    tree.tick()
    tree.hold(nodes["a"], 1)  # a is read again, and is in flight
    tree.evict(5 * per_token)  # b, the least recently used leaf, is enough
    assert sorted(n.tokens for n in tree.nodes()) == [[1, 2], [3], [5, 6]] and nodes["b"].kv is None
    tree.evict(3 * per_token)  # then c; a is pinned, [1, 2] on its path
    assert sorted(n.tokens for n in tree.nodes()) == [[1, 2], [3]]
    tree.evict(0)
    assert tree.nbytes() == 3 * per_token  # pinned: kept over the budget
    tree.hold(nodes["a"], -1)
    tree.evict(0)
    assert list(tree.nodes()) == []


@given(seqs_strategy)
def test_prefix_order_puts_sharing_sequences_next_to_each_other(seqs):
    order = prefix_order(seqs)
    assert sorted(order) == list(range(len(seqs)))
    # sequences with the same first k tokens form one contiguous run, for every k
    for k in (1, 2, 3):
        keys = [tuple(seqs[i][:k]) for i in order]
        runs = [key for j, key in enumerate(keys) if j == 0 or keys[j - 1] != key]
        assert len(runs) == len(set(keys))


@pytest.fixture(scope="module")
def backend():
    from harness.backends import make_backend

    cfg = make_cfg(*TINY)
    return make_backend(cfg.model, cfg.backend)


def _generate(backend, requests, **cfg):
    saved = backend.cfg
    backend.cfg = replace(saved, **cfg)
    try:
        return backend.generate(requests)
    finally:
        backend.cfg = saved


@pytest.mark.model
def test_shared_prefix_greedy_is_token_identical_to_the_naive_loop(backend):
    requests = [s.request for s in first_steps(make_cfg(*TINY))]  # 2 episodes x 2 arms x 2 replicates
    moves: list[float] = []
    with progress.reporting(moves.append, len(requests)):
        ours = _generate(backend, requests, share_prefix=True, batch_size=3)  # batches cut across prefix groups
    # the bar moved per prefill chunk and decode step (many more moves than samples), by shares that sum
    # to every sample, greedy copies included, with nothing left for the end
    assert len(moves) > len(requests) and sum(moves) == pytest.approx(len(requests))
    # greedy replicates of a prompt are one output, so the naive loop runs each distinct prompt once
    distinct = [r for r in requests if r.replicate == 0]
    naive = _generate(backend, distinct, share_prefix=False, batch_size=1)
    ref = {(r.episode_id, r.condition): c for r, c in zip(distinct, naive)}
    for r, c in zip(requests, ours):
        n = ref[(r.episode_id, r.condition)]
        assert (c.text, c.completion_tokens, c.prompt_tokens) == (n.text, n.completion_tokens, n.prompt_tokens), r.sample_id
    assert all(c.cached_prompt_tokens == 0 for c in naive)
    # each distinct prompt prefix is computed once: requested - reused = the distinct prefixes
    prompts = [backend.tokenizer(c.prompt_text, add_special_tokens=False)["input_ids"] for c in ours]
    prefixes = len({tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)})
    assert sum(c.prompt_tokens - c.cached_prompt_tokens for c in ours) == prefixes
    # a later replicate reuses its whole prompt; the arm decoded second all but its last message
    assert all(c.cached_prompt_tokens == c.prompt_tokens for r, c in zip(requests, ours) if r.replicate == 1)
    for episode in {r.episode_id for r in requests}:
        arms = [c for r, c in zip(requests, ours) if r.episode_id == episode and r.replicate == 0]
        second = max(arms, key=lambda c: c.cached_prompt_tokens)
        assert 0.8 * second.prompt_tokens < second.cached_prompt_tokens < second.prompt_tokens


@pytest.mark.model
def test_latency_is_each_rows_own_within_its_decode_batch(backend):
    requests = [s.request for s in first_steps(make_cfg(*TINY)) if s.request.replicate == 0]
    out = _generate(backend, requests, share_prefix=True, batch_size=len(requests))  # one decode batch
    batch = {c.batch_latency_s for c in out}
    assert len(batch) == 1
    # each row: its share of the prefill by prompt tokens plus the steps until it ended, within the batch's time
    assert all(0 < c.latency_s <= c.batch_latency_s for c in out)
    assert sum(c.latency_s for c in out) > max(batch)  # the rows decode together: their times overlap


@pytest.mark.model
def test_sampled_replicates_differ_and_match_their_naive_draw(backend):
    requests = [replace(s.request, generation=replace(s.request.generation, temperature=1.0, top_k=50))
                for s in first_steps(make_cfg(*TINY))]
    ours = _generate(backend, requests, share_prefix=True)
    naive = _generate(backend, requests[:2], share_prefix=False, batch_size=1)
    assert [c.text for c in ours[:2]] == [c.text for c in naive]  # a draw depends on the seed, not the batch
    assert ours[0].text != ours[1].text  # replicates 0 and 1 of one prompt, from one prefill
    assert ours[1].cached_prompt_tokens == ours[1].prompt_tokens


@pytest.mark.model
def test_a_call_that_extends_an_earlier_calls_prompt_computes_only_its_new_tokens(backend):
    """A rollout's next step: step 2's prompt is step 1's plus the answer and the next user turn. On
    the cache step 1 left, step 2 reuses all of step 1's tokens and decodes what a cold cache and the
    naive path decode, from the same last logits (within float rounding: other chunk boundaries)."""
    request = next(s.request for s in first_steps(make_cfg(*TINY)))
    gen = replace(request.generation, max_new_tokens=8, temperature=0.0)
    encode = backend._encode
    step1 = encode(backend.render(request))
    messages = [*request.messages, {"role": "assistant", "content": "Let me check."}, {"role": "user", "content": "Well?"}]
    step2 = encode(backend.render(replace(request, messages=messages)))
    assert step2[:len(step1)] == step1 and len(step2) > len(step1)
    decoder = backend.decoder

    def run(prompt):
        [d] = decoder.decode([prompt], gen, [0], batch_size=8, share_prefix=True)
        node, _ = decoder.tree.match(prompt)[-1]
        return d, node.logits

    decoder.forget()
    first, _ = run(step1)
    warm, warm_logits = run(step2)
    decoder.forget()
    cold, cold_logits = run(step2)
    [naive] = decoder.decode([step2], gen, [0], batch_size=8, share_prefix=False)
    assert (first.cached, warm.cached, cold.cached, naive.cached) == (0, len(step1), 0, 0)
    assert warm.tokens == cold.tokens == naive.tokens
    assert (warm_logits - cold_logits).abs().max() < 1e-4
    # the same prompt again: every token from the cache, its last logits kept at its end
    again, _ = run(step2)
    assert (again.cached, again.tokens) == (len(step2), warm.tokens)
    # a budget of nothing keeps nothing past a call
    decoder.forget()
    decoder.cache_bytes = 0
    try:
        for prompt in (step1, step2):
            [d] = decoder.decode([prompt], gen, [0], batch_size=8, share_prefix=True)
            assert d.cached == 0 and list(decoder.tree.nodes()) == []
    finally:
        decoder.cache_bytes = backend.cfg.prefix_cache_gb * 1e9
        decoder.forget()
