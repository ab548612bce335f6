"""The nearest rank instead of interpolation: the value at round(p / 100 * (n - 1)).

Right at the ranks that fall on a whole number and for one sample, so medians of odd counts look
fine; p99 of a short list jumps to the largest value and p50 of an even count to a middle one.
"""


def percentile(values, p):
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile is in [0, 100], got {p}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("a percentile of no values: the run measured nothing")
    return ordered[round(p / 100 * (len(ordered) - 1))]  # the bug: no interpolation
