"""The span taken from the last request sent, or from the first token: here from the last send.

Any interval shorter than first send to last token inflates the figure; under a Poisson arrival
the requests sent late finish late, and the early part of the run is lost.
"""


def output_throughput(requests, warmup=0):
    if warmup < 0:
        raise ValueError(f"warmup counts requests, got {warmup}")
    counted = list(requests)[warmup:]
    if not counted:
        raise ValueError(f"no request left after {warmup} warm-up ones: nothing to measure")
    start = max(sent for sent, _, _ in counted)  # the bug: the last send, not the first
    end = max(last for _, last, _ in counted)
    if end <= start:
        raise ValueError(f"the run spans {end - start} s: its last token came before its start")
    return sum(tokens for _, _, tokens in counted) / (end - start)
