"""The DecodeManager: the requests that have finished their prefill and generate a token per step."""

from __future__ import annotations

from typing import Dict, Iterable, List

from minisgl.core import Batch, Req


class DecodeManager:
    def __init__(self) -> None:
        self.running: Dict[int, Req] = {}  # uid -> request, in arrival order

    def filter_reqs(self, reqs: Iterable[Req]) -> None:
        """After a batch is launched: keep (or add) the requests that may decode further, drop the
        ones that reached max_tokens. Chunked prefills are not decoding yet."""
        for req in reqs:
            if getattr(req, "is_chunk", False):
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
