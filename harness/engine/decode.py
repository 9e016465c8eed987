"""The hf backend's decode engine: shared-prefix prefill and batched, left-padded decoding.

The prompts of one call form a prefix tree (`harness.engine.prefix`): the arms of an episode share all but
the last message, replicates share the whole prompt, episodes of a family share the system prompt and
tools. Each node's KV cache is computed once, on top of its parent's, and the leaves are decoded in
left-padded batches whose caches are the concatenated KV of their paths.

The decode loop is ours rather than `model.generate` so that each sample draws from its own seeded
generator: a sampled output depends on its seed only, not on which batch it landed in.
"""
from __future__ import annotations

import inspect
import time
from contextlib import nullcontext
from typing import Any, Callable, Iterator, NamedTuple

from harness import progress
from harness.engine.prefix import PrefixNode, PrefixTree, prefix_order
from harness.types import GenerationSettings


class Decoded(NamedTuple):
    tokens: list[int]
    finish: str  # stop | length
    # prompt tokens whose KV came from the prefix cache: computed in an earlier call (a rollout's
    # previous step) or for an earlier sample of this call
    cached: int
    # its own time: its share of the batch's prefill by prompt tokens, plus the decode steps until it ended
    latency: float
    scores: list[list[float]] | None = None  # per continuation asked for, the log-prob of each of its tokens
    batch_latency: float | None = None  # wall time of the batch that decoded it, with the prefills it needed
    after_scores: list[list[float]] | None = None  # per run `after` asked for once its tokens were generated


class PrefixDecoder:
    """Decodes token-id prompts with a causal LM, keeping the prompts' KV across calls (`PrefixTree`)."""

    def __init__(self, model: Any, eos_ids: set[int], device: str, pace: Callable[[], None] | None = None,
                 cache_gb: float = float("inf")):
        """`pace`: called between forward passes (each prefill chunk, each decode step), for the thread
        count to follow the machine (`harness.engine.threads.Adaptive`); None: nothing between them.
        `cache_gb`: what the prompts' KV may hold between calls; the least recently used runs go first."""
        self.model, self.eos_ids, self.device = model, eos_ids, device
        self.pace = pace
        import torch

        self.kv_bytes = kv_bytes_per_position(model)
        self.kv_layers, kv_heads, head_dim = kv_shape(model)
        self.kv_like = torch.empty(1, kv_heads, 0, head_dim, dtype=model.dtype, device=device)  # a cache's shape and dtype
        self.cache_bytes = cache_gb * 1e9
        # transformers 5.2x renamed forward's past_key_values to cache
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.tree = PrefixTree()

    def forget(self) -> None:
        """Drop every cached prompt (a benchmark's timed run starts cold)."""
        self.tree = PrefixTree()

    def prompt_kv(self, ids: list[int]) -> list[tuple[Any, Any]] | None:
        """Per-layer (keys, values) of prompt `ids` where the cache holds all of it (the attention
        probe replays on it instead of prefilling again); else None."""
        found = self.tree.match(ids)
        if sum(n for _, n in found) != len(ids) or any(node.kv is None for node, _ in found):
            return None
        kv = _concat_kv([node.kv for node, _ in found])
        return [(k[..., :len(ids), :], v[..., :len(ids), :]) for k, v in kv]

    def decode(self, prompts: list[list[int]], gen: GenerationSettings, seeds: list[int], *, batch_size: int,
               share_prefix: bool, kv_gb: float = float("inf"),
               continuations: list[list[list[int]] | None] | None = None,
               after: Callable[[int, list[int]], list[list[int]] | None] | None = None) -> list[Decoded]:
        """Decode every prompt, in batches of at most `batch_size` rows whose KV buffers (rows x
        (longest prompt + new tokens) positions) fit in `kv_gb`, on the prefix cache: what an earlier
        call or an earlier row computed of a prompt is reused, the rest computed once. Without
        `share_prefix` each prompt is computed on its own, outside the cache (the naive path the
        benchmark and the identity test compare against), batched by length. `continuations[i]`: token
        runs to score teacher-forced after prompt i, on top of the prompt's KV (once per distinct
        prompt). `after(i, tokens)`: token runs to score the same way once prompt i's tokens are
        generated (they may start with them), while the prompt's KV is still held; None for none."""
        # greedy decoding of identical prompts (greedy replicates) gives identical outputs: decode one, copy it
        copy = gen.greedy and share_prefix
        if share_prefix:
            self.tree.tick()
            ends = [self.tree.insert(p) for p in prompts]
            for node in {id(n): n for n in ends}.values():
                if node.kv is not None and node.logits is None:  # cached, but no prompt ended there: its last token again
                    if len(node.tokens) > 1:
                        self.tree.split(node, len(node.tokens) - 1)
                    node.kv = None
            order, copies = [], {}
            for i in prefix_order(prompts):  # depth-first: rows that share a prefix decode together
                if copy and id(ends[i]) in copies:
                    copies[id(ends[i])].append(i)
                    continue
                copies[id(ends[i])] = []
                order.append((i, ends[i]))
                self.tree.hold(ends[i], 1)
        else:
            order = [(i, PrefixNode(0, list(prompts[i]))) for i in sorted(range(len(prompts)), key=lambda i: len(prompts[i]))]
            copies = {}
        # the bar's unit of work: a token prefilled or decoded (a row's max_new_tokens, the rest
        # credited when it stops early); a sample's greedy copies cost nothing
        todo = {id(n): n for _, node in order for n in node.path() if n.kv is None}
        work = progress.Work(len(prompts), sum(len(n.tokens) for n in todo.values()) + len(order) * gen.max_new_tokens)
        prompt_ends = {id(node) for _, node in order}  # the nodes whose last logits decoding starts from
        results: list[Decoded | None] = [None] * len(prompts)
        scores: dict[int, list[list[float]]] = {}  # id(node) -> its prompt's continuation scores
        pending = list(order)
        try:
            with self._attention():
                for chunk in _batches(order, batch_size, gen.max_new_tokens, kv_gb * 1e9 / self.kv_bytes):
                    t0 = time.perf_counter()
                    cached = []
                    for i, node in chunk:
                        path = node.path()
                        cached.append(sum(len(n.tokens) for n in path if n.kv is not None))
                        self._prefill(path, prompt_ends, work)
                        if continuations and continuations[i] and id(node) not in scores:
                            scores[id(node)] = self._score(node, continuations[i])
                    t1 = time.perf_counter()
                    ended = [t1] * len(chunk)

                    def finished(r: int) -> None:
                        ended[r] = time.perf_counter()

                    outputs = self._sample([node for _, node in chunk], gen, [seeds[i] for i, _ in chunk], work, finished)
                    batch = time.perf_counter() - t0
                    prompt_tokens = [len(prompts[i]) for i, _ in chunk]
                    for (i, node), (tokens, finish), c, end, n in zip(chunk, outputs, cached, ended, prompt_tokens):
                        s = scores.get(id(node)) if continuations and continuations[i] else None
                        runs = after(i, tokens) if after else None
                        a = self._score(node, runs) if runs else None
                        latency = (t1 - t0) * n / sum(prompt_tokens) + (end - t1)
                        results[i] = Decoded(tokens, finish, c, latency, s, batch, a)
                        for j in copies.get(id(node), []):
                            results[j] = Decoded(list(tokens), finish, len(prompts[j]), latency, s, batch, a)
                    pending = pending[len(chunk):]
                    self._release(chunk if share_prefix else [])
        finally:  # an interrupted call leaves nothing pinned
            self._release(pending if share_prefix else [])
        return [r for r in results if r is not None]

    def _attention(self) -> Any:
        """The engine's attention (`harness.engine.attention`) for the call: prefill chunks and one-token
        steps without transformers' KV head copies. Another implementation than transformers' sdpa
        (flash attention on a GPU) is left alone."""
        from harness.engine import attention

        if self.model.config._attn_implementation != "sdpa":
            return nullcontext()
        return attention.attention_implementation(self.model, attention.NAME)

    def _release(self, rows: list[tuple[int, PrefixNode]]) -> None:
        """Unpin the rows' paths, then fit the cache in its budget."""
        for _, node in rows:
            self.tree.hold(node, -1)
        self.tree.evict(self.cache_bytes)

    def _prefill(self, path: list[PrefixNode], prompt_ends: set[int], work: progress.Work) -> None:
        """Compute the KV of every node of `path` not computed yet, each on top of its ancestors',
        in chunks of at most PREFILL_CHUNK tokens (the bar moves per chunk); a node in `prompt_ends`
        (by id) keeps its last logits too."""
        import torch

        from harness.engine.kvcache import prefill_cache

        for depth, node in enumerate(path):
            if node.kv is not None:
                continue
            cache = prefill_cache([n.kv for n in path[:depth]], len(node.tokens), self.kv_layers, self.kv_like)
            for a in range(node.start, node.end, PREFILL_CHUNK):
                b = min(a + PREFILL_CHUNK, node.end)
                with torch.inference_mode():
                    logits = self.model(
                        input_ids=torch.tensor([node.tokens[a - node.start:b - node.start]], device=self.device),
                        attention_mask=torch.ones(1, b, dtype=torch.long, device=self.device),
                        position_ids=torch.arange(a, b, device=self.device)[None],
                        use_cache=True, logits_to_keep=1, **{self.cache_kw: cache}).logits[0, -1]
                work.done(b - a)
                if self.pace:
                    self.pace()
            node.kv = [tuple(buf[:, :, node.start:node.end].clone() for buf in layer.bufs) for layer in cache.layers]
            node.logits = logits if id(node) in prompt_ends else None

    def _score(self, node: PrefixNode, runs: list[list[int]]) -> list[list[float]]:
        """Log-probabilities of each token of each run after the prompt ending at `node`: the first
        token from the prompt's last logits, the rest from one forward over the runs' prefix tree
        (`_run_tree`) on top of the prompt's KV: a prefix the runs share is computed once, and no
        row copies the prompt's KV."""
        import torch
        from transformers import DynamicCache

        last = node.logits.float().log_softmax(-1)
        out = [[float(last[r[0]])] for r in runs]
        tokens, parents, at = _run_tree([r[:-1] for r in runs])  # r[:-1]: the input whose next-token logits score r[1:]
        if not tokens:
            return out
        n = len(tokens)
        depth, seen = [], torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(parents):  # a tree token sees the prompt, its ancestors and itself
            depth.append(0 if p < 0 else depth[p] + 1)
            if p >= 0:
                seen[i] = seen[p]
            seen[i, i] = True
        mask = torch.cat([torch.ones(n, node.end, dtype=torch.bool), seen], dim=1)[None, None].to(self.device)
        positions = (node.end + torch.tensor(depth, device=self.device))[None]
        cache = DynamicCache(ddp_cache_data=_concat_kv([n.kv for n in node.path()]))
        with torch.inference_mode():
            logp = self.model(input_ids=torch.tensor([tokens], device=self.device), attention_mask=mask,
                              position_ids=positions, use_cache=True, **{self.cache_kw: cache}).logits[0].float().log_softmax(-1)
        for r, o, where in zip(runs, out, at):
            o.extend(float(logp[i, t]) for i, t in zip(where, r[1:]))
        return out

    def _sample(self, ends: list[PrefixNode], gen: GenerationSettings, seeds: list[int],
                work: progress.Work, finished: Callable[[int], None]) -> list[tuple[list[int], str]]:
        """Decode one left-padded batch whose row r continues the prompt ending at node ends[r];
        each step is `work` done, one unit per row, and a row that stops early its unused tokens;
        `finished(r)` as row r ends."""
        import torch
        from transformers.generation.logits_process import (
            LogitsProcessorList,
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        warpers = LogitsProcessorList()
        if not gen.greedy:
            warpers.append(TemperatureLogitsWarper(gen.temperature))
            if gen.top_k:
                warpers.append(TopKLogitsWarper(gen.top_k))
            if gen.top_p < 1.0:
                warpers.append(TopPLogitsWarper(gen.top_p))
            if gen.min_p > 0:
                warpers.append(MinPLogitsWarper(gen.min_p))
        from harness.engine import attention as decode_attention
        from harness.engine.kvcache import batch_cache

        generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        # runs several rows read are held apart only where the engine's attention runs (`_attention`)
        ours = self.model.config._attn_implementation == decode_attention.NAME
        share = ours and decode_attention.merges_parts(self.device) and _padding_only_masks(self.model)
        own, shared = _split(ends, SHARED_MIN_POSITIONS if share else None)
        cache = batch_cache([[n.kv for n in path] for path in own], gen.max_new_tokens,
                            [(_concat_kv([n.kv for n in run]), rows) for run, rows in shared])
        lengths = [sum(len(n.tokens) for n in path) for path in own]
        width = max(lengths)
        mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths], device=self.device)
        positions = torch.tensor([[n.end] for n in ends], device=self.device)
        logits = torch.stack([n.logits for n in ends])
        rows = list(range(len(ends)))  # batch position -> output row; finished rows leave the batch
        generated: list[list[int]] = [[] for _ in ends]
        done = [False] * len(ends)
        with torch.inference_mode():
            for step in range(gen.max_new_tokens):
                if gen.greedy:
                    nxt = logits.argmax(-1)
                else:
                    probs = torch.softmax(warpers(None, logits.float()), dim=-1)
                    nxt = torch.stack([torch.multinomial(probs[b], 1, generator=generators[r])[0] for b, r in enumerate(rows)])
                for r, tok in zip(rows, nxt.tolist()):
                    generated[r].append(tok)
                    done[r] = tok in self.eos_ids
                keep = [b for b, r in enumerate(rows) if not done[r]]
                last = step == gen.max_new_tokens - 1
                work.done(sum(gen.max_new_tokens - step if done[r] else 1 for r in rows))
                for r in rows if last else [r for r in rows if done[r]]:
                    finished(r)
                if not keep or last:
                    break
                if len(keep) < len(rows):
                    index = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(index)
                    mask, positions, nxt = mask[index], positions[index], nxt[index]
                    rows = [rows[b] for b in keep]
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
                logits = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions,
                                    use_cache=True, **{self.cache_kw: cache}).logits[:, -1, :]
                positions = positions + 1
                if self.pace:
                    self.pace()
        return [(g, "stop" if d else "length") for g, d in zip(generated, done)]


# prompt tokens per forward in prefill: the bar moves after each chunk (within seconds on a busy CPU
# at this size, for a 0.5B model), where a whole prompt tree's node can be thousands of tokens
PREFILL_CHUNK = 256

# a run of the prompt tree that several rows of a decode batch continue is held once and read once
# per step when that saves at least this many positions per step (`_split`); a shorter one is copied
# into each row's buffer, where it costs no attention call of its own
SHARED_MIN_POSITIONS = 256


def _split(ends: list[PrefixNode], min_saved: int | None) -> tuple[list[list[PrefixNode]], list[tuple[list[PrefixNode], list[int]]]]:
    """The nodes of the batch rows' paths (row r continues the prompt ending at ends[r]) split into
    each row's own, in path order, and the shared runs (consecutive nodes that the same rows read,
    taken as one) with their rows; min_saved None: none shared."""
    rows: dict[int, list[int]] = {}
    for r, end in enumerate(ends):
        for n in end.path():
            rows.setdefault(id(n), []).append(r)
    own: list[list[PrefixNode]] = []
    shared: dict[tuple[int, ...], tuple[list[PrefixNode], list[int]]] = {}
    for end in ends:
        mine: list[PrefixNode] = []
        for run in _runs(end.path(), rows):
            members = rows[id(run[0])]
            saved = sum(len(n.tokens) for n in run) * (len(members) - 1)
            if min_saved is not None and saved >= max(min_saved, 1):
                shared.setdefault(tuple(id(n) for n in run), (run, members))
            else:
                mine.extend(run)
        own.append(mine)
    return own, list(shared.values())


def _runs(path: list[PrefixNode], rows: dict[int, list[int]]) -> list[list[PrefixNode]]:
    """`path` cut where the rows reading its nodes change: a cached tree splits a prefix several rows
    share into many nodes (one per earlier call's prompt end), which they read as one run."""
    runs: list[list[PrefixNode]] = []
    for n in path:
        if runs and rows[id(runs[-1][-1])] == rows[id(n)]:
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs


def _padding_only_masks(model: Any) -> bool:
    """Whether a decode step's mask depends on padding alone (full causal attention): a sliding window
    or attention chunks mask by position, and a row's own buffer does not keep its tokens' positions
    once shared runs are held apart."""
    cfg = model.config.get_text_config()
    layer_types = getattr(cfg, "layer_types", None) or []
    return (not getattr(cfg, "sliding_window", None) and not getattr(cfg, "attention_chunk_size", None)
            and all(t == "full_attention" for t in layer_types))


def kv_shape(model: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of the model's cache."""
    cfg = model.config.get_text_config()
    heads = cfg.num_attention_heads
    return (cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads,
            getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)


def kv_bytes_per_position(model: Any) -> int:
    """Bytes of keys and values one token position takes in the model's cache, over all layers."""
    layers, kv_heads, head_dim = kv_shape(model)
    return 2 * layers * kv_heads * head_dim * model.dtype.itemsize


def _batches(order: list[tuple[int, PrefixNode]], rows: int, new_tokens: int, positions: float) -> Iterator[list[tuple[int, PrefixNode]]]:
    """`order` cut into consecutive decode batches of at most `rows` rows whose preallocated cache
    (rows x (longest prompt + new tokens) positions, `kvcache.batch_cache`) stays within `positions`;
    a row alone over it is still decoded alone."""
    chunk: list[tuple[int, PrefixNode]] = []
    width = 0
    for item in order:
        wider = max(width, item[1].end)
        if chunk and (len(chunk) == rows or (len(chunk) + 1) * (wider + new_tokens) > positions):
            yield chunk
            chunk, wider = [], item[1].end
        chunk.append(item)
        width = wider
    if chunk:
        yield chunk


def _concat_kv(parts: list[list[tuple[Any, Any]]]) -> list[tuple[Any, Any]]:
    """Per-layer (keys, values) of consecutive token runs, joined along the sequence axis."""
    import torch

    if len(parts) <= 1:
        return parts[0] if parts else []
    return [tuple(torch.cat([p[layer][j] for p in parts], dim=-2) for j in (0, 1)) for layer in range(len(parts[0]))]


def _run_tree(runs: list[list[int]]) -> tuple[list[int], list[int], list[list[int]]]:
    """The runs as a prefix tree of tokens: (token of each tree position, its parent's position or -1,
    per run the positions of its tokens). Parents come before their children."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}
    at = []
    for run in runs:
        here, where = -1, []
        for t in run:
            if (here, t) not in child:
                child[here, t] = len(tokens)
                tokens.append(t)
                parents.append(here)
            here = child[here, t]
            where.append(here)
        at.append(where)
    return tokens, parents, at
