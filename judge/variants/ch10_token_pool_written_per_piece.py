"""`try_add_one` that writes each piece's tokens into the token pool as the piece is admitted,
instead of the whole prompt once, when the request takes its slot.

The engine reads every piece's ids from the row, so the answers come out right; but the row of a
request part-way through its prefill holds only the pieces admitted so far, where the contract
(and whatever reads the row meanwhile) expects its whole prompt from the moment it has a slot.
"""


def try_add_one(self, pending):
    if self.token_budget <= 0:
        return None
    page_size = self.cache_manager.page_size
    prev = pending.chunked_req
    if prev is not None:  # admitted in an earlier step: its memory was checked then
        table_idx, handle, cached_len = prev.table_idx, prev.cache_handle, prev.cached_len
        self.reserved_pages += pages_for(pending.total_len, page_size) - pages_for(
            cached_len, page_size
        )
    else:
        if self.table_manager.available_size == 0:
            return None
        handle, indices = self.cache_manager.match_req(pending.input_ids)
        cached_len = handle.cached_len
        self.cache_manager.lock(handle)  # lock first: locked pages are not evictable
        need = pages_for(pending.total_len, page_size) - pages_for(cached_len, page_size)
        if need + self.reserved_pages > self.cache_manager.available_pages:
            self.cache_manager.unlock(handle)
            return None
        self.reserved_pages += need
        table_idx = self.table_manager.allocate(pending.uid)
        if cached_len:
            self.page_table[table_idx, :cached_len] = indices
    extend = len(pending.input_ids) - cached_len
    chunk = min(extend, self.token_budget)
    self.token_budget -= chunk
    piece = pending.input_ids[cached_len : cached_len + chunk]  # the bug: one piece at a time
    self.token_pool[table_idx, cached_len : cached_len + chunk] = piece.to(self.token_pool.device)
    params = pending.sampling_params
    if chunk < extend:
        req = ChunkedReq(  # noqa: F821 (the module's)
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
        req = Req(  # noqa: F821
            pending.input_ids,
            table_idx,
            cached_len,
            params.max_tokens,
            pending.uid,
            params,
            handle,
        )
        pending.chunked_req = None
    return req
