"""Upstream's `cache_req` for a running request: it frees the request's duplicate copy of a prefix
the cache already had, but leaves the request's page-table row pointing at the freed pages.

The next allocation hands those pages to another request, which overwrites them while the first
one still reads them as its prompt's keys and values: its outputs go wrong.
"""


def cache_req(self, req, *, finished):
    row, n = req.table_idx, req.cached_len
    locs = self.page_table[row, :n]
    old = req.cache_handle
    prefix_len, new = self.prefix_cache.insert_prefix(req.input_ids[:n], locs)
    if prefix_len > old.cached_len:
        self._free_locations(locs[old.cached_len : prefix_len].clone())
    self.unlock(old)
    if finished:
        self._free_locations(self.page_table[row, new.cached_len : n].clone())
        req.cache_handle = CacheHandle(0)
        return
    # the bug: the row still names the duplicate pages that were just freed
    self.lock(new)
    req.cache_handle = new
