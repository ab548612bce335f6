"""Upstream bug 4: an abort while the request's batch is in flight.

The abort releases the request (its prompt's KV goes into the prefix cache) but does not mark it
finished. When the in-flight prefill's results are handled, the request is treated as alive: it
gets a message, and `cache_req(finished=False)` inserts its prefix a second time; the "duplicate"
pages freed then are the cache's own, so the same pages end up both free and cached.
"""


def _abort(self, uid):
    pending = self.prefill_manager.get(uid)
    if pending is not None:
        self.prefill_manager.remove(pending)
        chunk = pending.chunked_req
        if chunk is None:
            self.events.emit("abort", uid=uid, state="queued")
            return
        self._free_req_resources(chunk)
        self.events.emit("abort", uid=uid, state="prefilling")
        return
    req = self._live.pop(uid, None)
    if req is not None:
        self.decode_manager.remove_req(req)
        self._free_req_resources(req)  # the bug: not added to finished_reqs
        self.events.emit("abort", uid=uid, state="running")
        return
    self.events.emit("abort", uid=uid, state="not running")
