"""`forward_batch` that never writes the samples into the token pool.

The outputs carry the right tokens, but the next step reads its input ids from the token pool,
where nothing was written: the step after this one runs on whatever the row held before (a zero,
or a stale token) and generation goes wrong from the second token on.
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
        out.next_tokens_gpu.copy_(tokens)  # the bug: self.token_pool[fi.write_tuple] is not set
        out.next_tokens_cpu.copy_(tokens, non_blocking=True)

    self.stream.launch(work)
    out.copy_done.record(self.stream)
    for req in batch.reqs:
        req.complete_one()
    return out
