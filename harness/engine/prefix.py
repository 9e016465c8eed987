"""Group prompts by shared prefix, so that a prefix is computed once. Pure Python, backend-neutral.

`prefix_order` is what a server-side prefix cache (vLLM's, an OpenAI-compatible server's) needs:
requests that share a prefix sent next to each other. `prefix_tree` is what the hf backend needs to
compute each shared prefix's KV cache once and branch it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from harness.types import Request, canonical_json


def prefix_order(keys: Sequence[Sequence]) -> list[int]:
    """Indices of `keys` (token lists or rendered strings) in lexicographic order: keys that share a
    prefix become adjacent, and the order is a depth-first walk of their prefix tree. Stable."""
    return sorted(range(len(keys)), key=lambda i: keys[i])


def prefix_key(req: Request) -> str:
    """A request's conversation as one string whose prefixes follow its messages' prefixes."""
    return canonical_json({"tools": req.tools, "messages": req.messages})


@dataclass
class PrefixNode:
    """A run of tokens shared by every member sequence: seq[start:start + len(tokens)]."""

    start: int
    tokens: list[int]
    members: list[int]  # indices of the sequences that pass through this node, in input order
    ends: list[int]  # members whose sequence ends with this node
    parent: PrefixNode | None = None
    children: list[PrefixNode] = field(default_factory=list)

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


def prefix_tree(seqs: Sequence[Sequence[int]]) -> list[PrefixNode]:
    """The radix tree of `seqs`: one root per distinct first token, a node per maximal shared run.
    Every sequence ends at exactly one node; identical sequences end at the same node."""
    if any(len(s) == 0 for s in seqs):
        raise ValueError("prefix_tree: every sequence needs at least one token")
    return [_build(seqs, members, 0, None) for members in _group_by_token(seqs, range(len(seqs)), 0)]


def leaves(roots: list[PrefixNode]) -> list[tuple[int, PrefixNode]]:
    """(sequence index, the node it ends at) in depth-first order: shared prefixes stay adjacent."""
    out: list[tuple[int, PrefixNode]] = []
    stack = roots[::-1]
    while stack:
        node = stack.pop()
        out.extend((i, node) for i in node.ends)
        stack.extend(node.children[::-1])
    return out


def _group_by_token(seqs: Sequence[Sequence[int]], members, pos: int) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for i in members:
        groups.setdefault(seqs[i][pos], []).append(i)
    return [groups[k] for k in sorted(groups)]


def _build(seqs: Sequence[Sequence[int]], members: list[int], start: int, parent: PrefixNode | None) -> PrefixNode:
    first = seqs[members[0]]
    end = min(len(seqs[i]) for i in members)
    for i in members[1:]:
        s, pos = seqs[i], start
        while pos < end and s[pos] == first[pos]:
            pos += 1
        end = pos
    node = PrefixNode(start, list(first[start:end]), members, [i for i in members if len(seqs[i]) == end], parent)
    rest = [i for i in members if len(seqs[i]) > end]
    node.children = [_build(seqs, group, end, node) for group in _group_by_token(seqs, rest, end)]
    return node
