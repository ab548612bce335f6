"""A chunk of n tokens counted as n arrivals at the same instant: n - 1 gaps of zero.

The ITL list grows with bundled tokens and its median falls towards zero.
"""


def stream_latencies(sent, chunks):
    stamps = [t for t, tokens in chunks for _ in range(tokens)]
    if not stamps:
        raise ValueError("the stream carried no token: no time to first token to measure")
    return stamps[0] - sent, [b - a for a, b in zip(stamps, stamps[1:])]  # the bug: zero gaps
