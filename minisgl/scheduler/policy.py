"""The order in which waiting requests are offered to the next prefill batch.

"fcfs" keeps arrival order. "lpm" (longest prefix match, as SGLang's policy of that name) offers
first the requests whose prompt the prefix cache holds most of: they cost the fewest prefill tokens,
and running them while their prefix is cached keeps it from being evicted before they come. Two
rules keep it honest:

* a short queue only: every waiting prompt is matched against the cache at every step, so past
  `max_queue` waiting requests the order falls back to arrival order (SGLang does the same, at 128);
* in-batch prefix sharing: of several waiting requests that would compute the same uncached tokens
  next, only the first keeps its place; the others move behind the rest. Admitted in one batch they
  would each compute those tokens; a step later the first one's tokens are cached and they match
  them.

Whatever the policy, a request part-way through a chunked prefill comes first (it holds a slot
and pages, and the prefill batch continues it before anything else), then retracted requests
(retract.py: they were running, and going first is what keeps them from starving).
"""

from __future__ import annotations

from typing import List, Tuple

from .cache import CacheManager
from .prefill import PendingReq

SHARED_RUN = 32  # uncached tokens two waiting prompts must share to count as one prefix


def order_queue(
    pending: List[PendingReq], cache_manager: CacheManager, policy: str, max_queue: int
) -> List[PendingReq]:
    """The waiting requests in the order the prefill batch should take them (a new list)."""
    if policy not in ("fcfs", "lpm"):
        raise ValueError(f"unknown schedule policy {policy!r}")
    started = [p for p in pending if p.chunked_req is not None]
    # a plain PendingReq (no plan, load.py) was never retracted
    retracted = [getattr(p, "retractions", 0) > 0 for p in pending]
    started += [p for p, r in zip(pending, retracted) if p.chunked_req is None and r]
    rest = [p for p, r in zip(pending, retracted) if p.chunked_req is None and not r]
    if policy == "fcfs" or len(pending) > max_queue:
        return started + rest
    scored: List[Tuple[int, int, PendingReq]] = []  # (-matched, arrival, request)
    first_of_run: dict = {}
    later: List[PendingReq] = []
    for arrival, p in enumerate(rest):
        matched = cache_manager.match_req(p.input_ids)[0].cached_len
        run = p.input_ids[matched : matched + SHARED_RUN]
        if len(run) == SHARED_RUN:
            key = (matched, tuple(run.tolist()))
            if key in first_of_run:
                later.append(p)
                continue
            first_of_run[key] = p
        scored.append((-matched, arrival, p))
    scored.sort(key=lambda t: (t[0], t[1]))
    return started + [p for _, _, p in scored] + later
