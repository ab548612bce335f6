"""Radix `_walk` that records no use at all: a match leaves every node's time as it was.

Only insertion stamps a node (the new leaf), so eviction follows the order in which entries were
first cached, not the order of last use: a prompt every request shares is evicted as soon as it is
the oldest entry, however often it matched. Outputs stay right; the cache keeps the wrong things.
"""


def _walk(self, ids):
    node, matched, values = self.root, 0, []
    while len(ids) - matched >= self.page_size:
        child = node.children.get(self._child_key(ids, matched))
        if child is None:
            break
        common = self._common_len(child.key, ids, matched)
        if common == 0:
            break
        if common < len(child.key):
            child = self._split(child, common)  # the bug: no node gets a new time
        values.append(child.value)
        matched += common
        node = child
    return node, matched, values
