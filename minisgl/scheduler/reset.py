"""A scheduler put back to idle after its loop was stopped part-way through a step (an exception
inside `LLM.generate`: minisgl/llm/recover.py says why this is how it is undone)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .scheduler import Scheduler


def reset_to_idle(scheduler: "Scheduler") -> None:
    """Drop every request wherever it stopped: nothing queued for prefill, running or in flight,
    every slot free, every page the prefix cache does not hold free, no lock held."""
    # Whatever is still queued on the device must land before its pages and rows are reused.
    scheduler.engine.synchronize()
    scheduler.stream.synchronize()
    scheduler._last_data = None
    scheduler.prefill_manager.pending.clear()
    scheduler.decode_manager.running.clear()
    scheduler._live.clear()
    scheduler.finished_reqs = set()
    scheduler._deferred_slots.clear()
    scheduler.retractions.clear()  # retract.py's books of the requests dropped
    scheduler._prompt_lens.clear()
    scheduler.table_manager.free_all()
    scheduler.cache_manager.reset_to_cached()
