"""Radix `_walk` that stamps only the node the walk ends on, not every node it passes.

A match through a shared prefix to one of its branches makes that branch recent but leaves the
prefix with its old time. Once the branch is evicted the prefix is a leaf that looks old although
it was just used, and it is evicted ahead of entries nobody has touched since. Outputs stay
right; the cache keeps the wrong things.
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
            child = self._split(child, common)
        values.append(child.value)
        matched += common
        node = child
    node.last_access = self._tick()  # the bug: the nodes passed on the way keep their old time
    return node, matched, values
