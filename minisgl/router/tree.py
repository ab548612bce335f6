"""The router's picture of one worker's prefix cache: a radix tree over the prompts it sent there.

It is approximate on purpose. The router never sees the worker's real cache (which pages it holds,
what it evicted); it remembers what it sent, as text (a chat's messages as their JSON) or token ids,
and assumes a prompt sent recently is still cached. Keys are sequences compared element by element:
a `str` (characters) or a tuple of token ids; a tree may hold both, which then share no prefix.

Size is counted in elements (characters or ids) along the edges. `evict(max_size)` bounds it: while
the tree holds more than `max_size`, the leaf used least recently goes, whole (a leaf's text is the
tail of the prompts that went through it; their shared head stays for the next tenant request). An
empty tree has size 0; a leaf touched by `insert` or a `match` that reaches it counts as used then.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Dict, Sequence

Key = Sequence  # a str or a tuple of token ids


@dataclass(eq=False)
class Node:
    edge: Key  # the elements from the parent to this node (the root's is empty)
    parent: "Node | None" = None
    children: Dict[object, "Node"] = field(default_factory=dict)  # by their edge's first element
    last_used: int = 0


def common_len(a: Key, b: Key) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixTree:
    def __init__(self) -> None:
        self.root = Node(edge=())
        self.size = 0  # elements held on all edges
        self._clock = itertools.count(1)  # use order: a larger last_used is more recent

    def match(self, key: Key) -> int:
        """How many leading elements of `key` the tree holds.

        That is the longest prefix of `key` that some inserted key shares.

        Receives: `key`, a str or a tuple of token ids (maybe empty).
        Returns: an int in [0, len(key)].
        Leaves: every node walked, the last one partly matched included, marked used now (its
            `last_used` set to a fresh tick of `self._clock`); the tree's shape and size unchanged.
        Uses: `common_len`; `Node.children`, keyed by their edge's first element.
        Checked: a match that leaves an edge midway stops there (what hangs below is not its
            prefix); text and token-id keys share nothing; eviction spares what a match touched.
        """
        node, i, now = self.root, 0, next(self._clock)
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                break
            n = common_len(child.edge, key[i:])
            child.last_used = now
            i += n
            if n < len(child.edge):
                break
            node = child
        return i

    def insert(self, key: Key) -> int:
        """Add `key`; return how many of its elements were there already (as `match` would).

        Receives: `key`, a str or a tuple of token ids.
        Returns: the length of the prefix of `key` the tree held before.
        Leaves: `match(key) == len(key)`; an edge that `key` leaves midway split in two at that
            point (an inner node holds the shared part, so no element is stored twice); one new
            leaf for the rest, if any; `size` grown by exactly the new elements; every node on the
            path below the root (the new inner node and leaf included) marked used with one fresh
            tick of `self._clock`; the lower half of a split keeps its own time.
        Uses: `common_len`, `Node`.
        Checked: it returns what was held before; sizes count shared prefixes once; a key inside
            an edge splits it and adds nothing; a key leaving an edge midway splits it there; the
            path is marked; the pool routes a tenant back to the worker whose tree got its prompt.
        """
        node, i, now = self.root, 0, next(self._clock)
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                leaf = Node(edge=key[i:], parent=node, last_used=now)
                node.children[key[i]] = leaf
                self.size += len(leaf.edge)
                return i
            n = common_len(child.edge, key[i:])
            if n < len(child.edge):  # split the edge: a new inner node holds the shared part
                inner = Node(edge=child.edge[:n], parent=node, last_used=now)
                node.children[key[i]] = inner
                child.edge, child.parent = child.edge[n:], inner
                inner.children[child.edge[0]] = child
                child = inner
            child.last_used = now
            i += n
            node = child
        return i

    def evict(self, max_size: int) -> int:
        """Remove least recently used leaves until `size <= max_size`; return the elements
        removed.

        Receives: `max_size` >= 0 (ValueError otherwise).
        Returns: the number of elements removed (0 when already within, at once: the pool calls
            this after every request, so a tree within its bound must not be walked).
        Leaves: `size <= max_size`; each removal a whole leaf, the one used longest ago first; a
            parent left without children becomes a leaf and may go next; nothing more removed
            than needed to get within the bound.
        Uses: `heapq` over (last_used, id, node) of the leaves.
        Checked: the oldest leaf goes first and whole; a recently matched key survives; an
            emptied parent goes in its turn; nothing more than needed; within the bound no walk;
            the size stays what the tree holds; every tree of a pool stays within max_tree_size.
        """
        if max_size < 0:
            raise ValueError(f"max_size must be at least 0, got {max_size}")
        if self.size <= max_size:
            return 0
        leaves = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(leaves)
        removed = 0
        while self.size > max_size and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            del parent.children[leaf.edge[0]]
            self.size -= len(leaf.edge)
            removed += len(leaf.edge)
            if parent is not self.root and not parent.children:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return removed

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
