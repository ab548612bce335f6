"""No check of the inputs: a negative warm-up count, and a span of zero or below, give a figure.

warmup = -1 slices from the end (counting only the last request), a span of zero divides by zero,
and a last token before its send gives a negative throughput, all where the run should say that
it measured nothing.
"""


def output_throughput(requests, warmup=0):
    counted = list(requests)[warmup:]  # the bug: warmup < 0 is not refused
    if not counted:
        raise ValueError(f"no request left after {warmup} warm-up ones: nothing to measure")
    start = min(sent for sent, _, _ in counted)
    end = max(last for _, last, _ in counted)
    return sum(tokens for _, _, tokens in counted) / (end - start)  # the bug: no span check
