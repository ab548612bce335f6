"""The DecodeManager: the requests that have finished their prefill and generate a token per
step."""

from __future__ import annotations

from typing import Dict, Iterable, List

from minisgl.core import Batch, Req


class DecodeManager:
    def __init__(self) -> None:
        self.running: Dict[int, Req] = {}  # uid -> request, in arrival order

    def filter_reqs(self, reqs: Iterable[Req]) -> None:
        """Keep (or add) the launched requests that may decode further; drop those at max_tokens.

        It runs right after a batch is launched, so each request's lengths already count the token
        being sampled: `can_decode` says whether one more decode step may follow.

        Receives: `reqs`, the requests of the batch just launched, prefill or decode; chunks of a
            chunked prefill among them have `is_chunk` True (every other request False).
        Returns: nothing.
        Leaves: `self.running` (uid -> request): every request that can decode is in it, every
            one that cannot is out of it, including one that never joined; a chunk never joins
            (its `can_decode` is always False). Their order is free: each row carries its own
            slot, so no token depends on it (adding a new one at the end keeps logs readable).
        Uses: `req.can_decode` (ch01), `req.is_chunk` (ch10: True on a `ChunkedReq`),
            `self.running` (ch07).
        Checked: requests that can decode join, a finished one never does and leaves
            once it reaches max_tokens; a chunked prefill is not decoding; batches compose over time
            as continuous batching says, with Hugging Face's tokens; every slot and page is back at
            the end.
        """
        for req in reqs:
            if req.is_chunk:
                continue
            if req.can_decode:
                self.running[req.uid] = req
            else:
                self.running.pop(req.uid, None)

    def remove_req(self, req: Req) -> None:
        if self.running.get(req.uid) is req:
            del self.running[req.uid]

    def get(self, uid: int) -> Req | None:
        return self.running.get(uid)

    @property
    def runnable(self) -> bool:
        return bool(self.running)

    def schedule_next_batch(self) -> Batch | None:
        reqs: List[Req] = [r for r in self.running.values() if r.can_decode]
        return Batch(reqs=reqs, phase="decode") if reqs else None
