"""Tokens divided by the sum of the requests' durations instead of the run's wall span.

Concurrent requests overlap: summing their durations counts the same seconds many times, and the
throughput of a batch of 64 reads like that of one request.
"""


def output_throughput(requests, warmup=0):
    if warmup < 0:
        raise ValueError(f"warmup counts requests, got {warmup}")
    counted = list(requests)[warmup:]
    if not counted:
        raise ValueError(f"no request left after {warmup} warm-up ones: nothing to measure")
    busy = sum(last - sent for sent, last, _ in counted)  # the bug: overlapping time counted twice
    if busy <= 0:
        raise ValueError(f"the run spans {busy} s: its last token came before its start")
    return sum(tokens for _, _, tokens in counted) / busy
