"""The rank taken as p / 100 * n instead of p / 100 * (n - 1): off by one rank.

Every percentile shifts up by a fraction of a rank; the top ones run past the last value and are
clamped to it, so p99 of a few samples reads as the maximum.
"""

import math


def percentile(values, p):
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile is in [0, 100], got {p}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("a percentile of no values: the run measured nothing")
    rank = min(p / 100 * len(ordered), len(ordered) - 1)  # the bug: n, not n - 1
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
