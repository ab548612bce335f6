"""The ids another rank owns clamped into range and looked up, but their rows never zeroed.

Clamping keeps F.embedding from reading past the rank's rows, so nothing raises; but every id
another rank owns reads this rank's first or last row, and the all-reduce adds those rows to the
owner's: every token's embedding is wrong.
"""


def lookup_own_rows(ids, weight, start):
    local = (ids - start).clamp(0, weight.shape[0] - 1)  # the bug: safe indices, no mask after
    return F.embedding(local, weight)
