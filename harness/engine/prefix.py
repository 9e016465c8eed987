"""Group prompts by shared prefix, so that a prefix is computed once. Pure Python, backend-neutral.

`prefix_order` is what a server-side prefix cache (vLLM's, an OpenAI-compatible server's) needs:
requests that share a prefix sent next to each other. `PrefixTree` is the hf engine's own prefix
cache: the radix tree of the prompts it has computed, each run of tokens with its KV, kept across
calls within a memory budget (least recently used runs go first, as in vLLM's prefix cache), so that a
rollout's next step, which extends the previous step's prompt, computes only its new tokens.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from harness.types import Request, canonical_json


def prefix_order(keys: Sequence[Sequence]) -> list[int]:
    """Indices of `keys` (token lists or rendered strings) in lexicographic order: keys that share a
    prefix become adjacent, and the order is a depth-first walk of their prefix tree. Stable."""
    return sorted(range(len(keys)), key=lambda i: keys[i])


def prefix_key(req: Request) -> str:
    """A request's conversation as one string whose prefixes follow its messages' prefixes."""
    return canonical_json({"tools": req.tools, "messages": req.messages})


@dataclass(eq=False)
class PrefixNode:
    """A run of tokens that every sequence through it holds at seq[start:start + len(tokens)], with what
    the engine computed for it: `kv`, per layer (keys, values) over its positions (sequence on axis -2),
    None until computed; `logits`, the next-token logits after its last token, kept where a prompt ends."""

    start: int
    tokens: list[int]
    parent: PrefixNode | None = None
    children: dict[int, PrefixNode] = field(default_factory=dict)  # by first token
    kv: Any = None
    logits: Any = None
    pins: int = 0  # rows of the call in flight that read it: never evicted while pinned
    used: int = 0  # the tree's clock when a call last read it

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def path(self) -> list[PrefixNode]:
        """Root first, self last."""
        nodes, node = [], self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def nbytes(self) -> int:
        tensors = [t for pair in self.kv or [] for t in pair] + ([self.logits] if self.logits is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


class PrefixTree:
    """The radix tree of every sequence inserted: one root per distinct first token, a node per maximal
    shared run. Nodes are split where a new sequence ends or leaves them (their KV split with them), so
    every sequence ends at exactly one node and identical sequences end at the same node."""

    def __init__(self) -> None:
        self.roots: dict[int, PrefixNode] = {}
        self.clock = 0

    def insert(self, seq: Sequence[int]) -> PrefixNode:
        """The node `seq` ends at, created (without KV) for the part of it not in the tree yet."""
        if len(seq) == 0:
            raise ValueError("prefix tree: a sequence needs at least one token")
        children, parent, pos = self.roots, None, 0
        while True:
            node = children.get(seq[pos])
            if node is None:
                node = children[seq[pos]] = PrefixNode(pos, list(seq[pos:]), parent)
                return node
            n = 1
            while n < len(node.tokens) and pos + n < len(seq) and node.tokens[n] == seq[pos + n]:
                n += 1
            if n < len(node.tokens):
                node = self.split(node, n)
            pos += n
            if pos == len(seq):
                return node
            children, parent = node.children, node

    def split(self, node: PrefixNode, at: int) -> PrefixNode:
        """Cut `node` after its first `at` tokens; the new head is returned, `node` keeps the rest (so a
        node a sequence ends at stays its end) and its logits. Both parts' KV are copies: either part
        evicted frees its memory."""
        head = PrefixNode(node.start, node.tokens[:at], node.parent, {node.tokens[at]: node}, pins=node.pins, used=node.used)
        (node.parent.children if node.parent else self.roots)[node.tokens[0]] = head
        if node.kv is not None:
            head.kv = [tuple(t[..., :at, :].clone() for t in pair) for pair in node.kv]
            node.kv = [tuple(t[..., at:, :].clone() for t in pair) for pair in node.kv]
        node.start, node.tokens, node.parent = node.start + at, node.tokens[at:], head
        return head

    def match(self, seq: Sequence[int]) -> list[tuple[PrefixNode, int]]:
        """The nodes of the longest prefix of `seq` in the tree, each with how many of its tokens it covers."""
        out, children, pos = [], self.roots, 0
        while pos < len(seq) and (node := children.get(seq[pos])) is not None:
            n = 1
            while n < len(node.tokens) and pos + n < len(seq) and node.tokens[n] == seq[pos + n]:
                n += 1
            out.append((node, n))
            if n < len(node.tokens):
                break
            pos, children = pos + n, node.children
        return out

    def tick(self) -> None:
        """A new call: what it reads from now on is more recent than anything read before."""
        self.clock += 1

    def hold(self, node: PrefixNode, pins: int) -> None:
        """Pin (+1) or release (-1) every node of `node`'s path, marking them used now."""
        for n in node.path():
            n.pins += pins
            n.used = self.clock

    def nodes(self) -> Iterator[PrefixNode]:
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def nbytes(self) -> int:
        return sum(n.nbytes() for n in self.nodes())

    def evict(self, budget: float) -> None:
        """Drop least recently used leaves (a parent becomes one when its last child goes) until what the
        nodes hold fits in `budget` bytes; pinned nodes stay whatever they hold."""
        total = self.nbytes()
        heap = [(n.used, id(n), n) for n in self.nodes() if not n.children and not n.pins]
        heapq.heapify(heap)
        while total > budget and heap:
            _, _, node = heapq.heappop(heap)
            total -= node.nbytes()
            siblings = node.parent.children if node.parent else self.roots
            del siblings[node.tokens[0]]
            node.kv = node.logits = None
            parent = node.parent
            if parent is not None and not parent.children and not parent.pins:
                heapq.heappush(heap, (parent.used, id(parent), parent))
