"""Radix `lock_handle` that moves a node's tokens between evictable and protected on every lock.

Right for one holder, wrong for two: a second lock on the same prefix counts its tokens as
protected twice, and the first unlock already hands them back as evictable while the other
request still holds them. The sizes move only when a count goes from 0 to 1 and back.
"""


def lock_handle(self, handle, unlock=False):
    node = handle.node
    if node is None:
        return
    while node is not self.root:
        if unlock:
            if node.ref_count <= 0:
                raise AssertionError("unlocking a radix node that is not locked")
            node.ref_count -= 1
            self._protected -= len(node.key)  # the bug: whatever the count was
            self._evictable += len(node.key)
        else:
            self._evictable -= len(node.key)  # the bug: also when it was locked already
            self._protected += len(node.key)
            node.ref_count += 1
        node = node.parent
