"""`try_add_one` that checks memory before it locks the cached prefix.

Until the handle is locked its pages are evictable, so they count as available: the check counts
them twice, once as the request's prefix and once as room for its other pages, and admits a request
whose pages are not there.
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
        need = pages_for(pending.total_len, page_size) - pages_for(cached_len, page_size)
        if need + self.reserved_pages > self.cache_manager.available_pages:
            return None
        self.cache_manager.lock(handle)  # the bug: after the check, which counted it as room
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
