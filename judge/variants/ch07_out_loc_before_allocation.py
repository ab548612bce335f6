"""`_prepare_batch` that reads the KV locations out of the page table before allocating them.

The page table has no location yet for the positions this step processes (-1, or a former
request's): the step writes its keys and values to the wrong place, and attention reads garbage.
"""


def _prepare_batch(self, batch):
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
    write_cols = [0 if r.is_chunk else r.device_len for r in batch.reqs]
    write_tuple = (
        kit.to_device(torch.tensor(write_rows, dtype=torch.int64)),
        kit.to_device(torch.tensor(write_cols, dtype=torch.int64)),
    )
    batch.positions = input_tuple[1]
    batch.out_loc = self.page_table[input_tuple].to(torch.int64)
    self.cache_manager.allocate_paged(batch.reqs)  # the bug: after out_loc was read
    batch.attn_metadata = prepare_metadata(batch, self.page_table, self.device)
    args = BatchSamplingArgs.from_params(
        [r.sampling_params for r in batch.reqs], self.vocab_size, self.device
    )
    return ForwardInput(batch, args, input_tuple, write_tuple)
