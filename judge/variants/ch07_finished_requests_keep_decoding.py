"""`filter_reqs` that adds the requests that may decode and never removes one that may not.

A request that has reached its max_tokens stays in the decode set: it runs one step more than it
was allowed, past the pages reserved for it, and its slot is not free when the scheduler thinks.
"""


def filter_reqs(self, reqs):
    for req in reqs:
        if req.is_chunk:
            continue
        if req.can_decode:
            self.running[req.uid] = req
        # the bug: a request that can no longer decode is left in self.running
