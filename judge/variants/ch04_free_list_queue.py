"""`free` that puts a freed row at the far end of the free list (a queue), so it is handed out last.

No row is ever shared, but the chapter's free list is a stack: the row freed last is reused first.
A queue hands out never-used rows before a freed one, so later requests get other slots than the
chapter's pictures show, and a freed row is not reused at once (chapter 11's slot-reuse hazard is
about exactly that reuse).
"""


def free(self, idx, uid=-1):
    if not (0 <= idx < self._max) or idx in self._free:
        raise RuntimeError(f"request slot {idx} freed twice or never allocated")
    self._free.insert(0, idx)  # the bug: append, so that pop() hands it out next
    self._events.emit("slot_free", table_idx=idx, uid=uid)
