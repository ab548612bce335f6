"""`_process_last_data` that releases the deferred slots at the end of the handling, after this
step's finished requests have been freed, instead of right after the wait on `copy_done`.

The wait shows that the step being handled is done, so the slots parked before it are safe. The
slots parked *during* the handling are not: the requests that end now still ride in the step in
flight, which will write its sample into their token-pool rows. Released at the end, those rows
go back at once, and the next scheduling can hand one to a waiting request, whose prompt that
pending write then spoils: upstream's problem 3 again, by another door.
"""


def _process_last_data(self, last_data):
    if last_data is None:
        return
    batch, output = last_data[0].batch, last_data[1]
    output.copy_done.synchronize()
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
            finished = len(req.input_ids) >= req.max_device_len
            if not req.sampling_params.ignore_eos and next_token in self.eos_token_ids:
                finished = True
            reply.append(DetokenizeMsg(uid=req.uid, next_token=next_token, finished=finished))  # noqa: F821
            if finished:
                self._live.pop(req.uid, None)
                self.decode_manager.remove_req(req)
                self._free_req_resources(req)
                new_finished.add(req)
            elif batch.is_prefill:
                self.cache_manager.cache_req(req, finished=False)
    self._release_deferred_slots()  # the bug: also releases the slots parked just now
    self.events.emit("handle", step=batch.step, phase=batch.phase, uids=[r.uid for r in batch.reqs])
    self.finished_reqs = new_finished
    self.send_result(reply)
