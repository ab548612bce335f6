"""`forward_batch` that advances the requests inside the launched work, when the step runs.

On a CPU with eager streams nothing changes, but on a GPU (or with deferred streams) the requests'
lengths still describe this step when the scheduler plans the next one: the next batch is built
on stale lengths, reads the wrong token pool column and writes its KV over this step's.
"""


def forward_batch(self, fi):
    batch = fi.batch
    out = ForwardOutput(
        next_tokens_gpu=torch.empty(batch.size, dtype=torch.int32, device=self.device),
        next_tokens_cpu=self.kit.pin(torch.empty(batch.size, dtype=torch.int32)),
        copy_done=self.kit.new_event(),
    )

    def work():
        batch.input_ids = self.token_pool[fi.input_tuple]
        tokens = self.sampler.sample(self.run_model(batch), fi.sample_args)
        out.next_tokens_gpu.copy_(tokens)
        self.token_pool[fi.write_tuple] = tokens
        out.next_tokens_cpu.copy_(tokens, non_blocking=True)
        for req in batch.reqs:  # the bug: only when the device gets to the step
            req.complete_one()

    self.stream.launch(work)
    out.copy_done.record(self.stream)
    return out
