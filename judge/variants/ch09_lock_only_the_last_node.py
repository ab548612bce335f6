"""Radix `lock_handle` that locks only the node the handle points at, not its path to the root.

The prefix above it stays evictable: a long-running request keeps its last edge, but the shared
prefix it sits on can be evicted under it, and its KV pages are handed to another request while
it still reads them.
"""


def lock_handle(self, handle, unlock=False):
    node = handle.node
    if node is None or node is self.root:
        return
    # the bug: no walk up to the root, only this one node changes
    if unlock:
        if node.ref_count <= 0:
            raise AssertionError("unlocking a radix node that is not locked")
        node.ref_count -= 1
        if node.ref_count == 0:
            self._protected -= len(node.key)
            self._evictable += len(node.key)
    else:
        if node.ref_count == 0:
            self._evictable -= len(node.key)
            self._protected += len(node.key)
        node.ref_count += 1
