"""`try_add_one` that compares a request's pages with `num_free_pages` instead of
`available_pages`.

The free list leaves out the pages the prefix cache holds but would give up (unlocked, evictable).
Once the cache fills with finished prompts the free list runs short while memory is plentiful,
and requests that would fit by evicting old prefixes wait.
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
        if need + self.reserved_pages > self.cache_manager.num_free_pages:  # the bug
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
    self.token_budget -= chunk
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
