"""`schedule_next_batch` that takes every request that got a piece off the queue, chunked or not.

A prompt longer than the budget runs its first chunk and is then forgotten: the rest of it is
never computed, the request never decodes, and its slot and pages stay taken.
"""


def schedule_next_batch(self, token_budget):
    adder = PrefillAdder(
        token_budget,
        self._reserved_pages(),
        self.cache_manager,
        self.table_manager,
        self.token_pool,
        self.page_table,
    )
    reqs = []
    for pending in list(self.pending):
        req = adder.try_add_one(pending)
        if req is None:
            break
        reqs.append(req)
        self.pending.remove(pending)  # the bug: also when pending.chunked_req holds a chunk
    return Batch(reqs=reqs, phase="prefill") if reqs else None
