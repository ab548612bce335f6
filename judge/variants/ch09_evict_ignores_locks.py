"""Radix `evict` that also evicts locked leaves.

A running request locks the path of its cached prefix; evicting it hands pages that request still
reads to another request, which overwrites them. Least-recently-used order alone does not protect
them: a long-running request's prefix is exactly the one not touched recently.
"""


def evict(self, num_tokens):
    if num_tokens <= 0:
        return self.root.value
    if num_tokens > self._evictable:
        raise RuntimeError(
            f"cannot evict {num_tokens} tokens: only {self._evictable} are evictable"
        )
    # the bug: ref_count ignored
    heap = [n for n in self._nodes() if n.is_leaf and n is not self.root]
    heapq.heapify(heap)
    freed = []
    total = 0
    while total < num_tokens and heap:
        leaf = heapq.heappop(heap)
        parent = leaf.parent
        del parent.children[self._child_key(leaf.key, 0)]
        freed.append(leaf.value)
        total += len(leaf.key)
        if leaf.ref_count == 0:
            self._evictable -= len(leaf.key)
        else:
            self._protected -= len(leaf.key)
        if parent is not self.root and parent.is_leaf:
            heapq.heappush(heap, parent)
    return torch.cat(freed)
