"""Radix `insert_prefix` that never stamps the new leaf with a time of use.

The leaf keeps last_access = 0, so it looks older than everything that was ever matched: the
sequence a request has just finished is the first thing evicted, ahead of entries nobody has used
for a long time. Outputs stay right; the cache keeps the wrong things.
"""


def insert_prefix(self, input_ids, indices):
    n = len(input_ids) - len(input_ids) % self.page_size
    ids = tuple(input_ids[:n].tolist())
    node, matched, _ = self._walk(ids)
    if matched < n:
        leaf = RadixNode(ids[matched:], indices[matched:n].clone(), node)  # the bug: no _tick()
        node.children[self._child_key(leaf.key, 0)] = leaf
        self._evictable += len(leaf.key)
        node = leaf
    return matched, CacheHandle(n, node)
