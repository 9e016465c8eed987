"""Prefix trees (pure) and the hf backend's shared-prefix decoding against the naive one-sample loop."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import progress
from harness.engine.prefix import leaves, prefix_order, prefix_tree
from harness.run import first_steps
from tests.conftest import make_cfg

TINY = ["scenario.calls_made=[2,3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
        "scenario.distractor_turns=[0]", "model.generation.max_new_tokens=8", "experiment.replicates=2",
        "backend.threads=1"]  # one thread: on a shared CPU, two threads per process oversubscribe it


def test_tree_of_two_arms_and_replicates():
    system, arm_a, arm_b = [1, 2, 3], [4, 5], [4, 6, 7]
    seqs = [system + arm_a, system + arm_a, system + arm_b, [9]]
    roots = prefix_tree(seqs)
    assert [r.tokens for r in roots] == [[1, 2, 3, 4], [9]]
    shared = roots[0]
    assert [c.tokens for c in shared.children] == [[5], [6, 7]]
    assert shared.children[0].ends == [0, 1]  # replicates end at one node
    assert [i for i, _ in leaves(roots)] == [0, 1, 2, 3]


def test_a_prompt_that_is_a_prefix_of_another_ends_inside_the_tree():
    roots = prefix_tree([[1, 2, 3], [1, 2]])
    assert roots[0].tokens == [1, 2] and roots[0].ends == [1] and roots[0].children[0].tokens == [3]


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="at least one token"):
        prefix_tree([[1], []])


seqs_strategy = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12)


@given(seqs_strategy)
def test_every_sequence_is_the_concatenation_of_its_path(seqs):
    found = leaves(prefix_tree(seqs))
    assert sorted(i for i, _ in found) == list(range(len(seqs)))
    for i, node in found:
        path = node.path()
        assert sum((n.tokens for n in path), []) == seqs[i]
        assert all(i in n.members and len(n.tokens) >= 1 for n in path)
    # no token is computed twice: the tree holds exactly the distinct prefixes
    nodes, stack = [], prefix_tree(seqs)
    while stack:
        nodes.append(stack.pop())
        stack.extend(nodes[-1].children)
    assert sum(len(n.tokens) for n in nodes) == len({tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)})


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
