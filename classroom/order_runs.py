"""Chapter 23's stand-ins for `order_queue`, for its try-out and the judge's tests.

`Queue` builds waiting requests whose cached prefix is known in advance and is the cache manager
`order_queue` asks: each prompt's own tokens (no two prompts share a token unless asked to), and
its `cached_len` as the request was built with. `tenant_tokens` runs the engine on two tenants'
interleaved requests and counts the prefill tokens each policy computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional
from unittest.mock import patch

import torch

from minisgl.core import SamplingParams
from minisgl.scheduler import load
from minisgl.scheduler.planned import PlannedReq
from minisgl.scheduler.prefill import ChunkedReq


@dataclass
class _Handle:
    cached_len: int


class Queue:
    """Waiting requests with known matches, and the cache manager that reports them."""

    def __init__(self) -> None:
        self._matched: Dict[int, int] = {}  # id of a prompt tensor -> its cached tokens
        self._next_token = 1000  # each prompt gets tokens no other prompt has

    def request(
        self,
        uid: int,
        length: int,
        matched: int,
        *,
        same_as: Optional[PlannedReq] = None,
        retractions: int = 0,
        started: bool = False,
    ) -> PlannedReq:
        """A waiting request of `length` prompt tokens, `matched` of them cached. `same_as`: its
        first `length - 1` tokens are that request's (two prompts that would compute the same
        tokens); `started`: part-way through a chunked prefill; `retractions`: retracted before."""
        if not 0 <= matched < length:
            raise ValueError(f"matched {matched} must be in [0, {length}) for a prompt of {length}")
        if same_as is not None:
            ids = same_as.input_ids[: length - 1].tolist() + [self._next_token]
            self._next_token += 1
        else:
            ids = list(range(self._next_token, self._next_token + length))
            self._next_token += length
        req = PlannedReq(
            uid,
            torch.tensor(ids, dtype=torch.int32),
            SamplingParams(max_tokens=4),
            retractions=retractions,
        )
        if started:
            req.chunked_req = ChunkedReq.__new__(ChunkedReq)  # only its presence is read
        self._matched[id(req.input_ids)] = matched
        return req

    def match_req(self, input_ids: torch.Tensor):
        if id(input_ids) not in self._matched:
            raise KeyError("a prompt this Queue did not build was matched")
        return _Handle(self._matched[id(input_ids)]), None


def uids(order: Optional[List[PlannedReq]]) -> Optional[List[int]]:
    return None if order is None else [p.uid for p in order]


def tenants() -> List[List[int]]:
    """Eight requests of two tenants whose 48-token system prompts share nothing, interleaved A,
    B, A, B..., each ending in its own two tokens."""
    system = {"A": list(range(10, 58)), "B": list(range(300, 348))}
    return [system["AB"[i % 2]] + [100 + 2 * i, 101 + 2 * i] for i in range(8)]


def tenant_tokens(make_llm, policy: str, order=None, **options):
    """(outputs, prefill tokens computed) of `tenants()` on one slot and a pool that holds one
    tenant's cached prompt besides the running request: the other tenant's prompt is evicted.
    `make_llm(**options)` builds the engine; `order`, if given, is the `order_queue` it runs."""
    if order is not None:
        with patch.object(load, "order_queue", order):
            return tenant_tokens(make_llm, policy, **options)
    prompts = tenants()
    longest = max(len(x) for x in prompts) + 4
    llm = make_llm(
        max_running_req=1, num_page_override=longest + 30, schedule_policy=policy, **options
    )
    log = llm.events.record()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    out = [o["token_ids"] for o in llm.generate(prompts, params)]
    llm.cache_manager.check_integrity()
    tokens = sum(
        sum(e["extend_lens"]) for e in log if e.kind == "launch" and e["phase"] == "prefill"
    )
    return out, tokens
