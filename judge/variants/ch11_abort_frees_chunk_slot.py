"""Upstream bug 3 in another form: an abort that arrives part-way through a chunked prefill frees
the request's slot at once.

The chunk launched last may still be in flight, and it reads its prompt from the slot's row of the
token pool. Handing the row to a waiting request now lets the scheduler write that request's prompt
into it before the chunk has run. A freed slot, whoever frees it, goes back only once no batch in
flight can still use it: `_free_req_resources` defers it under overlap.
"""


def _abort(self, uid):
    pending = self.prefill_manager.get(uid)
    if pending is not None:
        self.prefill_manager.remove(pending)
        chunk = pending.chunked_req
        if chunk is None:
            self.events.emit("abort", uid=uid, state="queued")
            return
        self.table_manager.free(chunk.table_idx, chunk.uid)  # the bug: not deferred under overlap
        self.cache_manager.cache_req(chunk, finished=True)
        self.finished_reqs.add(chunk)
        self.events.emit("abort", uid=uid, state="prefilling")
        return
    req = self._live.pop(uid, None)
    if req is not None:
        self.decode_manager.remove_req(req)
        self._free_req_resources(req)
        self.finished_reqs.add(req)
        self.events.emit("abort", uid=uid, state="running")
        return
    self.events.emit("abort", uid=uid, state="not running")
