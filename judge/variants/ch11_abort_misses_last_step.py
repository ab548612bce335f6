"""`_abort` that looks for a launched request in the decode manager rather than in `_live`.

The decode manager drops a request as soon as its last step is launched, so a request whose last
step is in flight is in neither the prefill queue nor the decode manager: this abort finds
"not running" and leaves it alone. That step's results are then handled as if nobody had
aborted: the client that left gets its last token (and the finished flag) after its abort. It is
the abort that meets the request's end in the same turn, a client closing the connection as the
answer completes, and `_live` is the one structure that still knows the request then.
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
        self.finished_reqs.add(chunk)
        self.events.emit("abort", uid=uid, state="prefilling")
        return
    # the bug: a request whose last step is in flight has already left the decode manager
    req = self.decode_manager.get(uid)
    if req is not None:
        self._live.pop(uid, None)
        self.decode_manager.remove_req(req)
        self._free_req_resources(req)
        self.finished_reqs.add(req)
        self.events.emit("abort", uid=uid, state="running")
        return
    self.events.emit("abort", uid=uid, state="not running")
