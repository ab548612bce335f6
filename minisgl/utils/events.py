"""The engine's event log: what the scheduler did and when, for tests, the judge and the timeline
views. Code that wants to watch the engine subscribes a callback instead of patching methods.

Event kinds (fields in brackets):
  launch      a batch was handed to the engine          [step, phase, uids, table_idxs, extend_lens]
  handle      the results of a batch were processed      [step, phase, uids]
  send        messages went back to the receiver (LLM, tokenizer worker)  [msgs]
  slot_alloc  a request slot (table row) was given out    [table_idx, uid]
  slot_free   a request slot went back to the free list   [table_idx, uid]
  pages_alloc KV pages were given to a request             [uid, pages]
  pages_free  KV pages went back to the free list          [pages]
  abort       an abort was processed                       [uid, state]
  reject      a request was refused                        [uid, reason]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List


@dataclass
class EngineEvent:
    kind: str
    time: float
    fields: Dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return f"{self.kind}({inner})"


Callback = Callable[[EngineEvent], None]


class EventLog:
    """Calls every subscriber synchronously on each event; keeps the events only if asked to."""

    def __init__(self) -> None:
        self._subscribers: List[Callback] = []
        self.records: List[EngineEvent] | None = None

    def subscribe(self, fn: Callback) -> Callable[[], None]:
        """Register `fn`; returns a function that unregisters it."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn)

    def record(self) -> List[EngineEvent]:
        """Start keeping every event in `self.records` (and return that list)."""
        self.records = []
        return self.records

    @property
    def active(self) -> bool:
        return bool(self._subscribers) or self.records is not None

    def emit(self, kind: str, **fields: Any) -> None:
        if not self.active:  # the hot path pays nothing when nobody listens
            return
        event = EngineEvent(kind, time.perf_counter(), fields)
        if self.records is not None:
            self.records.append(event)
        for fn in list(self._subscribers):
            fn(event)
