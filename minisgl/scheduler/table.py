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
        """Take a free row for request `uid` and return it (row 0 first, on a fresh manager). Raises
        RuntimeError when every row is taken; emits `slot_alloc`."""
        if not self._free:
            raise RuntimeError("no free request slot")
        idx = self._free.pop()
        self._events.emit("slot_alloc", table_idx=idx, uid=uid)
        return idx

    def free(self, idx: int, uid: int = -1) -> None:
        """Give row `idx` back for reuse. Raises RuntimeError, changing nothing, for a row that is
        out of range or already free (a double free would hand one row to two requests); emits
        `slot_free`."""
        if not (0 <= idx < self._max) or idx in self._free:
            raise RuntimeError(f"request slot {idx} freed twice or never allocated")
        self._free.append(idx)
        self._events.emit("slot_free", table_idx=idx, uid=uid)
