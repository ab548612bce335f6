"""The warm-up requests counted: their tokens are added and the span starts at the first of them.

The warm-up ran before the measured load, often with a pause in between: the span grows by the
pause, and the figure mixes a cold server with a warm one.
"""


def output_throughput(requests, warmup=0):
    if warmup < 0:
        raise ValueError(f"warmup counts requests, got {warmup}")
    counted = list(requests)  # the bug: the warm-up is not dropped
    if len(counted) <= warmup:
        raise ValueError(f"no request left after {warmup} warm-up ones: nothing to measure")
    start = min(sent for sent, _, _ in counted)
    end = max(last for _, last, _ in counted)
    if end <= start:
        raise ValueError(f"the run spans {end - start} s: its last token came before its start")
    return sum(tokens for _, _, tokens in counted) / (end - start)
