"""`schedule_next_batch` that skips a request that has to wait and goes on with the next.

Small requests behind a large one then fill every batch: the large one waits as long as short
prompts keep arriving, possibly forever. First come, first served: a request that waits stops the
batch.
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
            continue  # the bug: the next one may overtake it
        reqs.append(req)
        if pending.chunked_req is None:
            self.pending.remove(pending)
    return Batch(reqs=reqs, phase="prefill") if reqs else None
