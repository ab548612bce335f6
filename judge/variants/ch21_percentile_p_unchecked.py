"""p is never checked against [0, 100]: p = 100.5 or -1 gives a figure instead of an error.

The rank then falls past either end of the list; with the index clamped it reads as the largest
(or the smallest) value, a percentile that does not exist printed as if it did.
"""

import math


def percentile(values, p):
    ordered = sorted(values)  # the bug: no check that p is in [0, 100]
    if not ordered:
        raise ValueError("a percentile of no values: the run measured nothing")
    rank = min(max(p / 100 * (len(ordered) - 1), 0), len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
