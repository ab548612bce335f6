"""Upstream bug 3: a request slot reused while a batch in flight still writes to it.

When a request that hit EOS at step N is handled, step N+1, which still contains it, is running
and will write its sample into the request's token-pool row. Upstream returns the row at once; the
next step can give it to a new request, whose prompt the scheduler writes into the same row with
no ordering against that pending write. On a GPU the new prompt can be overwritten; with deferred
CPU streams it is, every time.
"""


def _free_req_resources(self, req):
    self.table_manager.free(req.table_idx, req.uid)  # the bug: no deferral under overlap
    self.cache_manager.cache_req(req, finished=True)
