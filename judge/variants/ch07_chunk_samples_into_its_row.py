"""`_prepare_batch` that writes a chunk's sample into the chunk's own row, at device_len.

A chunk's sample is junk, and column device_len of its row holds the prompt's next token, which
the next chunk reads: the junk overwrites it, and the rest of the prompt is prefilled with one
wrong token. Only the scratch row may take it.
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
    write_rows = [r.table_idx for r in batch.reqs]  # the bug: a chunk's junk lands in its row
    write_cols = [r.device_len for r in batch.reqs]
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
