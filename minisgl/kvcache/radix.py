"""The radix prefix cache: a tree of token sequences whose KV is kept after requests end.

Every edge holds a run of tokens (its *key*) and the KV locations of those tokens (its *value*).
Requests that share a prefix share the path from the root. Three rules keep it sound:

* page alignment: keys are cut only at multiples of page_size, so a page is never half cached;
* locking: a running request locks the path it uses (ref_count on every node up to the root);
  a locked node is never evicted;
* eviction frees least-recently-used unlocked *leaves* first; a parent becomes a leaf, and a
  candidate, only once its children are gone.
"""

from __future__ import annotations

import heapq
from typing import Dict, List, Tuple

import torch

from .base import BasePrefixCache, CacheHandle


class RadixNode:
    __slots__ = ("children", "parent", "key", "value", "ref_count", "last_access")

    def __init__(
        self, key: Tuple[int, ...], value: torch.Tensor, parent: "RadixNode | None"
    ) -> None:
        self.children: Dict[Tuple[int, ...], RadixNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.ref_count = 0
        self.last_access = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __lt__(self, other: "RadixNode") -> bool:  # for the eviction heap
        return self.last_access < other.last_access


class RadixPrefixCache(BasePrefixCache):
    def __init__(self, page_size: int, device: torch.device) -> None:
        self.page_size = page_size
        self.device = device
        self.root = RadixNode((), torch.empty(0, dtype=torch.int32, device=device), None)
        self.root.ref_count = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0
        self._clock = 0

    # ------------------------------------------------------------------ helpers

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _child_key(self, ids: Tuple[int, ...], start: int) -> Tuple[int, ...]:
        return ids[start : start + self.page_size]

    def _common_len(self, key: Tuple[int, ...], ids: Tuple[int, ...], start: int) -> int:
        """Length of the common prefix of `key` and `ids[start:]`, rounded down to whole pages."""
        n = min(len(key), len(ids) - start)
        i = 0
        while i < n and key[i] == ids[start + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut `node`'s edge after `at` tokens; returns the new upper node (which keeps node's
        locks)."""
        upper = RadixNode(node.key[:at], node.value[:at], node.parent)
        upper.ref_count, upper.last_access = node.ref_count, node.last_access
        upper.parent.children[self._child_key(upper.key, 0)] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._child_key(node.key, 0)] = node
        return upper

    def _walk(self, ids: Tuple[int, ...]) -> Tuple[RadixNode, int, List[torch.Tensor]]:
        """Follow `ids` down the tree as far as whole pages match; split the edge where it stops.

        Both match and insert start here. The walk also records use: every node it passes gets the
        same new time, which is what least-recently-used eviction reads.

        Receives: `ids`, a tuple of token ids (any length; a tail shorter than a page never
            matches); the tree from `self.root`, whose nodes hold `key` (tokens), `value` (their KV
            locations) and `children` keyed by the first page (`page_size` tokens) of each child's
            edge.
        Returns: (the deepest node reached, the number of tokens matched, a multiple of page_size,
            the list of the values of the nodes passed below the root, in order: together, the
            matched locations).
        Leaves: an edge the match ends inside split there (the upper half keeps the node's locks and
            time; no location moves); the root and every node passed stamped with one new `_tick()`;
            the evictable and protected sizes unchanged.
        Uses: `self._child_key`, `self._common_len`, `self._split`, `self._tick` (ch09).
        Checked: a match returns the inserted locations; a match inside an edge splits it at a page
            start and keeps the values in place; only whole pages match; eviction follows the order
            of last use and a split's lower half keeps its time; random operations keep the tree
            consistent; a repeated prompt computes only its last token.
        """
        node, matched, values = self.root, 0, []
        now = self._tick()
        node.last_access = now
        while len(ids) - matched >= self.page_size:
            child = node.children.get(self._child_key(ids, matched))
            if child is None:
                break
            common = self._common_len(child.key, ids, matched)
            if common == 0:
                break
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now
            values.append(child.value)
            matched += common
            node = child
        return node, matched, values

    # ------------------------------------------------------------------ the interface

    def match_prefix(self, input_ids: torch.Tensor) -> Tuple[CacheHandle, torch.Tensor]:
        ids = tuple(input_ids.tolist())
        node, matched, values = self._walk(ids)
        indices = torch.cat(values) if values else self.root.value
        return CacheHandle(matched, node), indices

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> Tuple[int, CacheHandle]:
        """Add a sequence's whole pages to the tree and say how much of it was cached already.

        Receives: `input_ids` [n] token ids and `indices` [n] their KV locations (int32); only the
            first n - n % page_size tokens are cached.
        Returns: (prefix_len, handle): prefix_len, the tokens the tree already held (the caller's
            locations for them are duplicates, its to free); `CacheHandle(cached_len, node)`
            covering every whole-page token, node being the deepest node of that path.
        Leaves: the tokens past prefix_len as one new leaf under the node reached, with a copy of
            their locations, stamped as just used and unlocked (`evictable_size` grows by its
            length); nothing new when all was cached. Splits and time stamps come from the walk.
        Uses: `self._walk`, `self._tick`, `self._child_key`, `RadixNode` (ch09); `CacheHandle`
            (ch08).
        Checked: a match returns the inserted locations; a diverging insert shares the common
            prefix; only whole pages are inserted; a new leaf counts as just used; random operations
            keep the tree consistent; the engine reuses cached prompts and still gives Hugging
            Face's tokens.
        """
        n = len(input_ids) - len(input_ids) % self.page_size  # only whole pages are cached
        ids = tuple(input_ids[:n].tolist())
        node, matched, _ = self._walk(ids)
        if matched < n:
            leaf = RadixNode(ids[matched:], indices[matched:n].clone(), node)
            leaf.last_access = self._tick()
            node.children[self._child_key(leaf.key, 0)] = leaf
            self._evictable += len(leaf.key)
            node = leaf
        return matched, CacheHandle(n, node)

    def lock_handle(self, handle: CacheHandle, unlock: bool = False) -> None:
        """Protect the path of `handle` from eviction or, with `unlock`, stop protecting it.

        Locks nest: two requests on one prefix lock it twice, and it is protected until both unlock.

        Receives: `handle`, from a match or an insert (its node is None for an empty match: nothing
            to lock); `unlock`, False to lock, True to unlock.
        Returns: nothing.
        Leaves: the `ref_count` of every node from the handle's node up to the root (the root
            excluded) one higher (one lower to unlock); a node whose count leaves 0 moves its tokens
            from `evictable_size` to `protected_size`, one whose count returns to 0 moves them back.
            Unlocking a node whose count is already 0 raises AssertionError.
        Uses: `RadixNode.ref_count`, `.parent`, `self.root`, `self._evictable`, `self._protected`
            (ch09).
        Checked: locks move tokens between evictable and protected and nest; an empty handle locks
            nothing; an unlock too many raises AssertionError; a locked path is never evicted, nor
            the prefix of a running request; random operations keep the tree consistent.
        """
        node = handle.node
        if node is None:
            return
        while node is not self.root:
            if unlock:
                if node.ref_count <= 0:
                    raise AssertionError(
                        "unlocking a prefix that is not locked: a node on it has no lock left "
                        "(ref_count 0), so the prefix was unlocked more often than it was "
                        "locked; each lock (a request admitted on the prefix, or its prefix "
                        "cached again by cache_req) is undone exactly once"
                    )
                node.ref_count -= 1
                if node.ref_count == 0:
                    self._protected -= len(node.key)
                    self._evictable += len(node.key)
            else:
                if node.ref_count == 0:
                    self._evictable -= len(node.key)
                    self._protected += len(node.key)
                node.ref_count += 1
            node = node.parent

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Free least recently used unlocked leaves until at least `num_tokens` locations are freed.

        Receives: `num_tokens`, the locations wanted (0 or less: nothing to do).
        Returns: the freed KV locations (int32, whole nodes, so possibly more than asked; empty when
            nothing was asked). Raises RuntimeError, changing nothing, when more than
            `evictable_size` is asked.
        Leaves: the evicted leaves out of their parents' `children`, `evictable_size` lower by their
            length; a parent left without children, unlocked and not the root, is a candidate in the
            same call; locked nodes untouched.
        Uses: `self._nodes`, `RadixNode.is_leaf`, `.ref_count`, `.last_access` (nodes compare by it,
            so `heapq` gives the oldest), `self._child_key` (ch09).
        Checked: least recently used leaves go first, then their parent; whole leaves go until
            enough is free; a locked path and the prefix of a running request are never evicted;
            random operations keep the tree consistent; outputs stay Hugging Face's under memory
            pressure.
        """
        if num_tokens <= 0:
            return self.root.value
        if num_tokens > self._evictable:
            raise RuntimeError(
                f"cannot evict {num_tokens} tokens: only {self._evictable} are evictable"
            )
        heap = [n for n in self._nodes() if n.is_leaf and n.ref_count == 0 and n is not self.root]
        heapq.heapify(heap)
        freed: List[torch.Tensor] = []
        total = 0
        while total < num_tokens:
            leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key, 0)]
            freed.append(leaf.value)
            total += len(leaf.key)
            self._evictable -= len(leaf.key)
            if parent is not self.root and parent.is_leaf and parent.ref_count == 0:
                heapq.heappush(heap, parent)
        return torch.cat(freed)

    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    def unlock_all(self) -> None:
        """Drop every lock (an interrupted run left some behind, with no request running)."""
        for node in self._nodes():
            node.ref_count = 0
        self._evictable += self._protected
        self._protected = 0

    def _nodes(self) -> List[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def all_indices(self) -> torch.Tensor:
        values = [n.value for n in self._nodes() if n is not self.root]
        return torch.cat(values) if values else self.root.value

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._nodes():
            if node is self.root:
                continue
            assert node.ref_count >= 0, f"negative ref_count on a node of {len(node.key)} tokens"
            assert len(node.key) == len(node.value), "a node's key and value differ in length"
            assert len(node.key) > 0 and len(node.key) % self.page_size == 0, (
                "a node is not page-aligned"
            )
            assert node.parent.children.get(self._child_key(node.key, 0)) is node, (
                "a node is not under its first page"
            )
            assert node.parent is self.root or node.parent.ref_count >= node.ref_count, (
                "a node is locked more often than its parent"
            )
            if node.ref_count == 0:
                evictable += len(node.key)
            else:
                protected += len(node.key)
        assert evictable == self._evictable, (
            f"evictable size {self._evictable} != counted {evictable}"
        )
        assert protected == self._protected, (
            f"protected size {self._protected} != counted {protected}"
        )
        idx = self.all_indices()
        assert idx.numel() == torch.unique(idx).numel(), (
            "a KV location appears twice in the radix tree"
        )
