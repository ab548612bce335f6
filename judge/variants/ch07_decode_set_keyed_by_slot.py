"""A decode set keyed by request slot (table_idx) instead of uid.

It looks the same while every request's slot equals its uid. Once a request takes over a freed
slot, `remove_req` (which looks up by uid) no longer finds it: a request that samples end-of-text
stays in the decode set and goes on generating.
"""


def filter_reqs(self, reqs):
    for req in reqs:
        if req.is_chunk:
            continue
        if req.can_decode:
            self.running[req.table_idx] = req
        else:
            self.running.pop(req.table_idx, None)
