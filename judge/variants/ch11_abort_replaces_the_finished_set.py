"""`_abort` that sets `finished_reqs` to the aborted request instead of adding it.

`finished_reqs` is what the turn's handling of the step in flight must skip: the requests that
finished or were aborted after it was launched. A request that sampled EOS in the turn before
is in it; an abort taken in now replaces it, and that request's extra token, from the step
launched before its EOS was known, reaches its client after the EOS.
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
        self.finished_reqs = {chunk}  # the bug: replaces the set
        self.events.emit("abort", uid=uid, state="prefilling")
        return
    req = self._live.pop(uid, None)
    if req is not None:
        self.decode_manager.remove_req(req)
        self._free_req_resources(req)
        self.finished_reqs = {req}  # the bug: replaces the set
        self.events.emit("abort", uid=uid, state="running")
        return
    self.events.emit("abort", uid=uid, state="not running")
