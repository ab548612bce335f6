"""The order in which waiting requests are offered to the next prefill batch.

"fcfs" keeps arrival order. "lpm" (longest prefix match, as SGLang's policy of that name) offers
first the requests whose prompt the prefix cache holds most of: they cost the fewest prefill tokens,
and running them while their prefix is cached keeps it from being evicted before they come.
Whatever the policy, a request part-way through a chunked prefill comes first (it holds a slot
and pages, and the prefill batch continues it before anything else), then retracted requests
(retract.py: they were running, and going first is what keeps them from starving):
`split_front` separates them, and `order_queue` (chapter 23's exercise) orders the rest.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .cache import CacheManager
from .prefill import PendingReq

POLICIES = ("fcfs", "lpm")
SHARED_RUN = 32  # uncached tokens two waiting prompts must share to count as one prefix


def split_front(pending: List[PendingReq]) -> Tuple[List[PendingReq], List[PendingReq]]:
    """(front, rest): the requests that go first whatever the policy, each group in queue order
    (a started chunked prefill, then the retracted ones), and the others in queue order."""
    started = [p for p in pending if p.chunked_req is not None]
    # a plain PendingReq (no plan, load.py) was never retracted
    retracted = [getattr(p, "retractions", 0) > 0 for p in pending]
    started += [p for p, r in zip(pending, retracted) if p.chunked_req is None and r]
    rest = [p for p, r in zip(pending, retracted) if p.chunked_req is None and not r]
    return started, rest


def uncached_run(input_ids: torch.Tensor, matched: int) -> Optional[tuple]:
    """What a prompt would compute next, as a key two prompts share when they would compute the
    same tokens: (matched, its first SHARED_RUN uncached tokens); None when fewer are left."""
    run = input_ids[matched : matched + SHARED_RUN]
    return (matched, tuple(run.tolist())) if len(run) == SHARED_RUN else None


def order_queue(
    pending: List[PendingReq], cache_manager: CacheManager, policy: str, max_queue: int
) -> List[PendingReq]:
    """The waiting requests in the order the prefill batch should take them.

    Receives: `pending` the waiting queue in arrival order; `cache_manager` whose
        `match_req(input_ids)[0].cached_len` is how many of a prompt's tokens the prefix cache
        holds; `policy` "fcfs" or "lpm"; `max_queue` the longest queue lpm still matches.
    Returns: a new list of the same requests: `split_front`'s front, then the rest. Under "fcfs",
        or when more than `max_queue` requests wait (all of `pending` counted), the rest keep
        arrival order. Under "lpm" the rest go by cached tokens, most first; requests with equal
        matches keep arrival order; and a request whose `uncached_run` key (not None) an earlier
        one of the rest already has goes behind all the others, in arrival order.
    Leaves: `pending` as it was (the order is a new list); the prefix cache holding the same
        tokens (a match may split a node where it stops and stamps the nodes it walks as used, as
        every match does).
    Raises: ValueError naming the policy when it is not one of POLICIES.
    Uses: `split_front`, `uncached_run`; `cache_manager.match_req` (ch08).
    Checked: the most cached first, ties in arrival order; FCFS past max_queue; a twin of an
        uncached run behind the rest; front first; fewer prefill tokens than FCFS on two tenants.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown schedule policy {policy!r}: expected one of {POLICIES}")
    front, rest = split_front(pending)
    if policy == "fcfs" or len(pending) > max_queue:
        return front + rest
    kept: List[Tuple[PendingReq, int]] = []  # (request, tokens cached), in arrival order
    seen_runs, twins = set(), []
    for p in rest:
        matched = cache_manager.match_req(p.input_ids)[0].cached_len
        run = uncached_run(p.input_ids, matched)
        if run in seen_runs:  # an earlier request computes these tokens: wait, then match them
            twins.append(p)
            continue
        if run is not None:
            seen_runs.add(run)
        kept.append((p, matched))
    kept.sort(key=lambda pm: -pm[1])  # a stable sort: equal matches keep arrival order
    return front + [p for p, _ in kept] + twins
