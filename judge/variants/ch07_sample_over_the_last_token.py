"""`_prepare_batch` that writes each sample at column device_len - 1, over the request's last token.

The token pool then loses the last input token of every request: the next step reads the sample
where its input should be, the KV of that position is computed for the wrong token again, and
the text goes wrong from the second generated token on.
"""


def _prepare_batch(self, batch):
    self.cache_manager.allocate_paged(batch.reqs)
    kit = self.engine.kit
    if batch.is_decode:  # one token per request: two plain lists, no tensor per request
        rows = torch.tensor([req.table_idx for req in batch.reqs], dtype=torch.int64)
        positions = torch.tensor([req.cached_len for req in batch.reqs], dtype=torch.int64)
    else:
        rows = torch.cat(
            [torch.full((req.extend_len,), req.table_idx, dtype=torch.int64) for req in batch.reqs]
        )
        positions = torch.cat(
            [torch.arange(req.cached_len, req.device_len, dtype=torch.int64) for req in batch.reqs]
        )
    input_tuple = (kit.to_device(rows), kit.to_device(positions))
    # Each sample goes to the position after the request's last token; a chunk's sample is junk
    # and goes to the scratch row.
    dummy = self.engine.dummy_row
    write_rows = [dummy if r.is_chunk else r.table_idx for r in batch.reqs]
    write_cols = [0 if r.is_chunk else r.device_len - 1 for r in batch.reqs]  # the bug
    write_tuple = (
        kit.to_device(torch.tensor(write_rows, dtype=torch.int64)),
        kit.to_device(torch.tensor(write_cols, dtype=torch.int64)),
    )
    batch.positions = input_tuple[1]
    batch.out_loc = self.page_table[input_tuple].to(torch.int64)
    batch.attn_metadata = prepare_metadata(batch, self.page_table, self.device)
    args = BatchSamplingArgs.from_params(
        [r.sampling_params for r in batch.reqs], self.vocab_size, self.device
    )
    return ForwardInput(batch, args, input_tuple, write_tuple)
