"""The ids shifted to the rank's rows in place (`ids -= start`), changing the caller's tensor.

Every rank looks up the same `ids`: in the engine each rank has its own copy, but a caller that
looks up twice (or, here, three ranks' lookups from one tensor) sees ids already shifted and
zeroed by the first call, so the later lookups read the wrong rows.
"""


def lookup_own_rows(ids, weight, start):
    ids -= start  # the bug: the caller's tensor changed
    mine = (ids >= 0) & (ids < weight.shape[0])
    ids[~mine] = 0
    return F.embedding(ids, weight) * mine.unsqueeze(-1).to(weight.dtype)
