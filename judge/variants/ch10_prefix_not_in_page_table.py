"""`try_add_one` that uses a cached prefix but never writes its locations into the request's row.

The piece starts after the prefix, as it should, but the page table row holds nothing there (or
a former request's locations): attention reads the wrong keys and values for every cached token,
and the text goes wrong whenever a prompt's start was cached.
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
        # the bug: the cached prefix's locations are not written into the page table
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
