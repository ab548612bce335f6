"""The span ends at the last request's last token, not at the latest last token of any request.

Requests finish out of order: a request sent early with a long answer may end after the last one
sent, and the span then misses the end of the run.
"""


def output_throughput(requests, warmup=0):
    if warmup < 0:
        raise ValueError(f"warmup counts requests, got {warmup}")
    counted = list(requests)[warmup:]
    if not counted:
        raise ValueError(f"no request left after {warmup} warm-up ones: nothing to measure")
    start = min(sent for sent, _, _ in counted)
    end = counted[-1][1]  # the bug: the last request's end, not the latest end
    if end <= start:
        raise ValueError(f"the run spans {end - start} s: its last token came before its start")
    return sum(tokens for _, _, tokens in counted) / (end - start)
