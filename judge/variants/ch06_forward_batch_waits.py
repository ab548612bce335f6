"""`forward_batch` that waits for its step before returning.

The text is right, but the CPU stops at every step until the device is done: the scheduler can no
longer plan the next step while this one runs, and chapter 11's overlap is gone.
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

    self.stream.launch(work)
    out.copy_done.record(self.stream)
    out.copy_done.synchronize()  # the bug: the CPU waits for the step
    for req in batch.reqs:
        req.complete_one()
    return out
