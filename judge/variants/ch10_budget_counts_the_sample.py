"""`try_add_one` that charges each piece one token more than it computes, for its sample.

The budget counts the prompt tokens a step computes; the sampled token is an output, computed by
no one in this step. Charged for it, every piece costs one token too many: a budget of 6 after a
5-token prompt has nothing left, batches stay short of the budget while prompts wait, and long
prompts take more steps than they should.
"""


def try_add_one(self, pending):
    if self.token_budget <= 0:
        return None
    page_size = self.cache_manager.page_size
    prev = pending.chunked_req
    if prev is not None:
        table_idx, handle, cached_len = prev.table_idx, prev.cache_handle, prev.cached_len
        self.reserved_pages += pages_for(pending.total_len, page_size) - pages_for(
            cached_len, page_size
        )
    else:
        if self.table_manager.available_size == 0:
            return None
        handle, indices = self.cache_manager.match_req(pending.input_ids)
        cached_len = handle.cached_len
        self.cache_manager.lock(handle)
        need = pages_for(pending.total_len, page_size) - pages_for(cached_len, page_size)
        if need + self.reserved_pages > self.cache_manager.available_pages:
            self.cache_manager.unlock(handle)
            return None
        self.reserved_pages += need
        table_idx = self.table_manager.allocate(pending.uid)
        n = len(pending.input_ids)
        self.token_pool[table_idx, :n] = pending.input_ids.to(
            self.token_pool.device, non_blocking=True
        )
        if cached_len:
            self.page_table[table_idx, :cached_len] = indices
    extend = len(pending.input_ids) - cached_len
    chunk = min(extend, self.token_budget)
    self.token_budget -= chunk + 1  # the bug: the piece's sample is counted as a token
    params = pending.sampling_params
    if chunk < extend:
        req = ChunkedReq(
            pending.input_ids[: cached_len + chunk],
            table_idx,
            cached_len,
            params.max_tokens,
            pending.uid,
            params,
            handle,
        )
        pending.chunked_req = req
    else:
        req = Req(
            pending.input_ids, table_idx, cached_len, params.max_tokens, pending.uid, params, handle
        )
        pending.chunked_req = None
    return req
