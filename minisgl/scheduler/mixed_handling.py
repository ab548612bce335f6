"""The handling of a mixed step's results (chapter 23's mixed batches, load.py).

A mixed step runs as a prefill, and chapter 11's `_process_last_data` hands every unfinished
request of a prefill to the prefix cache (`cache_req(req, finished=False)`): right for a prompt just
computed, and a wasted walk of the radix tree for each decoder riding in the step, whose prompt was
cached when its own prefill was handled (a pure decode step caches nothing). `prefill_rows_only`
hides the decode rows from that call for the time of one handling, leaving chapter 11's exercise
and its contract as they are.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from minisgl.core import Batch, Req


class _PrefillRowsCache:
    """The cache manager, except that one mixed step's decode rows are not cached unfinished."""

    def __init__(self, inner, decodes: set) -> None:
        self._inner = inner
        self._decodes = decodes

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def cache_req(self, req: Req, finished: bool) -> None:
        if not finished and req in self._decodes:
            return  # a decoder: its prompt is cached already, its new token has no KV yet
        self._inner.cache_req(req, finished=finished)


@contextmanager
def prefill_rows_only(scheduler, batch: Batch | None) -> Iterator[None]:
    """For the handling of `batch`: `scheduler.cache_manager` caches the prefill rows alone."""
    if batch is None or not batch.mixed_decodes:
        yield
        return
    real = scheduler.cache_manager
    scheduler.cache_manager = _PrefillRowsCache(real, set(batch.reqs[-batch.mixed_decodes :]))
    try:
        yield
    finally:
        scheduler.cache_manager = real
