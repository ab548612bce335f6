"""Upstream bug 2: a stale message after EOS.

A request that samples EOS at step N has already been scheduled into step N+1 (the CPU did not know
yet). Upstream remembers it in `finished_reqs` only to avoid freeing it twice; it still appends the
extra token and sends a message for it, so the frontend receives one token after the end.
"""


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
            finished = len(req.input_ids) >= req.max_device_len
            if not req.sampling_params.ignore_eos and next_token in self.eos_token_ids:
                finished = True
            # the bug
            reply.append(DetokenizeMsg(uid=req.uid, next_token=next_token, finished=finished))
            if finished and req not in self.finished_reqs:  # only guards against a double free
                self._live.pop(req.uid, None)
                self.decode_manager.remove_req(req)
                self._free_req_resources(req)
                new_finished.add(req)
            elif batch.is_prefill and req not in self.finished_reqs:
                self.cache_manager.cache_req(req, finished=False)
    self.events.emit("handle", step=batch.step, phase=batch.phase, uids=[r.uid for r in batch.reqs])
    self.finished_reqs = new_finished
    self.send_result(reply)
