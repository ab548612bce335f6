"""What an interrupted `LLM.generate` leaves behind: nothing.

An exception inside generate (Ctrl-C in a notebook, an error raised by an event subscriber or by
the progress bar) can stop the scheduler anywhere in a step: pages taken but not yet written into
a request's row, a request launched but not yet counted as running, a batch in flight whose tokens
nobody will read. Undoing each of those one by one would need every step to be a transaction.

Nothing the engine held can be trusted to be in a whole state, except the prefix cache's tree (a
prefix enters it only once its KV is computed), so the engine is put back to idle from it: every
page the tree does not hold is free, no lock is held, every request slot is free, nothing is
queued, pending, running or in flight, and the call's results are gone. When the engine was idle
before the call (generate is how it is used), that is exactly the state before the call; only the
cache may have gained prefixes, as after a call that finished.

Requests added before the call with `add_request` and still unfinished were cut short with the
call's own (one of their tokens may have been lost with the interrupted step): each ends with an
"error" saying so, never with silently wrong tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

from minisgl.scheduler.reset import reset_to_idle as scheduler_reset_to_idle

if TYPE_CHECKING:
    from minisgl.scheduler import QueueIO, Scheduler


def reset_to_idle(
    scheduler: "Scheduler",
    queue: "QueueIO",
    results: Dict[int, Any],  # uid -> the LLM's RequestResult
    uids: List[int],
    error: BaseException,
) -> None:
    """Put the engine back to idle after `error` interrupted the call whose requests are `uids`,
    wherever it stopped them: `scheduler`'s state, the messages in `queue` and the `results`."""
    scheduler_reset_to_idle(scheduler)
    queue.clear()
    for uid in uids:
        results.pop(uid, None)
    reason = (
        f"interrupted: {type(error).__name__} raised inside LLM.generate stopped the engine "
        "with this request unfinished"
    )
    for result in results.values():
        if not result.finished:
            result.error, result.finished = reason, True
