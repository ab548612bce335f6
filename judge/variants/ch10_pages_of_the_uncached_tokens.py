"""`try_add_one` that reserves `pages_for(total - cached)` pages instead of
`pages_for(total) - pages_for(cached)`.

Equal when the cached part ends on a page boundary (a prefix-cache hit always does), and always
with pages of one token; but a chunked request's cached part ends wherever its last piece stopped:
with pages of 4, 11 tokens of which 1 is cached need 3 - 1 = 2 more pages (the first page is
already partly used), not 3. Each continued piece then promises a page too many, and requests that
would fit wait.
"""


def try_add_one(self, pending):
    if self.token_budget <= 0:
        return None
    page_size = self.cache_manager.page_size
    prev = pending.chunked_req
    if prev is not None:  # admitted in an earlier step: its memory was checked then
        table_idx, handle, cached_len = prev.table_idx, prev.cache_handle, prev.cached_len
        # the bug: the pages of the uncached tokens, as if they began on a page boundary
        self.reserved_pages += pages_for(pending.total_len - cached_len, page_size)
    else:
        if self.table_manager.available_size == 0:
            return None
        handle, indices = self.cache_manager.match_req(pending.input_ids)
        cached_len = handle.cached_len
        self.cache_manager.lock(handle)  # lock first: locked pages are not evictable
        need = pages_for(pending.total_len - cached_len, page_size)  # the bug
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
