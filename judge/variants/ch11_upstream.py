"""Upstream mini-sglang's overlap handling, all four bugs at once (see the single-bug variants
ch11_upstream_finished/stale/slot/abort for each one explained)."""


def _process_last_data(self, last_data):
    if last_data is None:
        return
    batch, output = last_data[0].batch, last_data[1]
    output.copy_done.synchronize()
    self._release_deferred_slots()
    reply = []
    new_finished = set()
    tokens = output.next_tokens_cpu
    with self.cache_manager.lazy_free_region():
        for i, req in enumerate(batch.reqs):
            if req.is_chunk:
                continue
            token = tokens[i : i + 1]
            req.append_host(token)
            next_token = int(token.item())
            finished = not req.can_decode  # bug 1
            if not req.sampling_params.ignore_eos and next_token in self.eos_token_ids:
                finished = True
            # bug 2
            reply.append(DetokenizeMsg(uid=req.uid, next_token=next_token, finished=finished))
            if (
                finished and req not in self.finished_reqs
            ):  # bug 2: only guards against a double free
                self._live.pop(req.uid, None)
                self.decode_manager.remove_req(req)
                self._free_req_resources(req)
                new_finished.add(req)
            elif batch.is_prefill and req not in self.finished_reqs:
                self.cache_manager.cache_req(req, finished=False)
    self.events.emit("handle", step=batch.step, phase=batch.phase, uids=[r.uid for r in batch.reqs])
    self.finished_reqs = new_finished
    self.send_result(reply)


def _free_req_resources(self, req):
    self.table_manager.free(req.table_idx, req.uid)  # bug 3: no deferral under overlap
    self.cache_manager.cache_req(req, finished=True)


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
        self._free_req_resources(req)  # bug 4: not added to finished_reqs
        self.events.emit("abort", uid=uid, state="running")
        return
    self.events.emit("abort", uid=uid, state="not running")
