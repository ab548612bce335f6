"""`allocate_paged` that always starts a new page, ignoring the room left in the request's last one.

Outputs stay right (every token gets its own location), but each step with page_size > 1 leaks the
rest of a page: the pages are in nobody's page table, so they are never freed, and the pool runs
dry.
"""


def allocate_paged(self, reqs):
    p = self.page_size
    for req in reqs:
        start, end = req.cached_len, req.device_len
        n = end - start
        new = self._take_pages(pages_for(n, p))  # the bug: the last held page may still have room
        if len(new):
            self._events.emit("pages_alloc", uid=req.uid, pages=len(new))
        locs = (
            new.unsqueeze(1) * p + torch.arange(p, dtype=torch.int32, device=self.device)
        ).flatten()
        self.page_table[req.table_idx, start:end] = locs[:n]
