"""`schedule_next_batch` that tells the adder nothing is reserved for the running requests.

Each new request is checked against the free pages alone, as if the running requests would never
grow: they are promised their max_tokens, but a newcomer takes the pages they still need, and the
pool runs dry in the middle of a request.
"""


def schedule_next_batch(self, token_budget):
    adder = PrefillAdder(
        token_budget,
        0,
        self.cache_manager,  # the bug: not self._reserved_pages()
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
        if pending.chunked_req is None:
            self.pending.remove(pending)
    return Batch(reqs=reqs, phase="prefill") if reqs else None
