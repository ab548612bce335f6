"""Upstream bug 1: `finished` decided from `can_decode`.

Under overlap, when step N's results are handled step N+1 has already been launched and each
request's device_len has moved on, so `not req.can_decode` turns true one token early: a request
with max_tokens=3 is flagged finished on its 2nd token, and its 3rd token comes with a second
finished flag. A streaming client stops reading at the first flag and gets max_tokens - 1 tokens.
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
            if req in self.finished_reqs:
                continue
            token = tokens[i : i + 1]
            req.append_host(token)
            next_token = int(token.item())
            finished = not req.can_decode  # the bug: this already reflects the step in flight
            if not req.sampling_params.ignore_eos and next_token in self.eos_token_ids:
                finished = True
            reply.append(DetokenizeMsg(uid=req.uid, next_token=next_token, finished=finished))
            if finished:
                self._live.pop(req.uid, None)
                self.decode_manager.remove_req(req)
                self._free_req_resources(req)
                new_finished.add(req)
            elif batch.is_prefill:
                self.cache_manager.cache_req(req, finished=False)
    self.events.emit("handle", step=batch.step, phase=batch.phase, uids=[r.uid for r in batch.reqs])
    self.finished_reqs = new_finished
    self.send_result(reply)
