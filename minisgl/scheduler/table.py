"""Request slots. A running request owns one row of the page table (its KV locations) and the same
row of the token pool (its token ids); the TableManager hands rows out and takes them back."""

from __future__ import annotations

from typing import List

from minisgl.utils import EventLog


class TableManager:
    def __init__(self, max_running_req: int, events: EventLog | None = None) -> None:
        self._max = max_running_req
        self._free: List[int] = list(range(max_running_req - 1, -1, -1))  # pop() gives 0 first
        self._events = events or EventLog()

    @property
    def available_size(self) -> int:
        return len(self._free)

    @property
    def capacity(self) -> int:
        return self._max

    def allocate(self, uid: int = -1) -> int:
        """Take a free row for request `uid` and return it (row 0 first, on a fresh manager).

        A row (a request slot) is the request's row of the page table and of the token pool; no two
        running requests may share one.

        Receives: `uid`, the request the row is for (only reported in the event; -1 if unknown).
        Returns: the row index, an int in [0, capacity), not handed out since it was last freed.
        Leaves: the row off the free list (`available_size` one lower); one `slot_alloc` event with
            `table_idx` and `uid`. With every row taken: raises RuntimeError, changing nothing.
        Uses: `self._free` (the free rows), `self._events.emit` (ch04).
        Checked: rows handed out are distinct; a full manager refuses; a freed row is handed out
            again; the `slot_alloc` event names the row and the request.
        """
        if not self._free:
            raise RuntimeError("no free request slot")
        idx = self._free.pop()
        self._events.emit("slot_alloc", table_idx=idx, uid=uid)
        return idx

    def free(self, idx: int, uid: int = -1) -> None:
        """Give row `idx` back for reuse.

        A row freed twice would later be handed to two requests at once, so a bad free is refused.

        Receives: `idx`, a row a request held; `uid`, that request (only reported in the event).
        Returns: nothing. Raises RuntimeError, changing nothing, for a row out of range or already
            free.
        Leaves: the row back on the free list (`available_size` one higher); one `slot_free` event
            with `table_idx` and `uid`.
        Uses: `self._free`, `self._max` (the capacity), `self._events.emit` (ch04).
        Checked: a freed row can be allocated again; a double free and a row never allocated (out of
            range or negative) are refused and change nothing; the `slot_free` event names the row
            and the request.
        """
        if not (0 <= idx < self._max) or idx in self._free:
            raise RuntimeError(f"request slot {idx} freed twice or never allocated")
        self._free.append(idx)
        self._events.emit("slot_free", table_idx=idx, uid=uid)

    def free_all(self) -> None:
        """Every row free again, as on a fresh manager (after an interrupted run, with no request
        running)."""
        self._free = list(range(self._max - 1, -1, -1))
