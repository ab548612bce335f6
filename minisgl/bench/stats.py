"""The measurement math of a serving benchmark (chapter 21), used by benchmarks/bench_serve.py.

A streamed request gives a list of chunks, each with the time it arrived and how many generated
tokens it carries. From those come time to first token (TTFT), inter-token latencies (ITL) and,
over all requests of a run, output tokens per second; tails are read as percentiles.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile of `values`, by linear interpolation between the closest ranks.

    The values are sorted; rank p / 100 * (n - 1) (counting from 0) lies between two of them, and
    the result is the straight line between those two, as numpy.percentile's default ("linear")
    computes it. The 0th percentile is the smallest value, the 100th the largest, and one value is
    every percentile of itself.

    Receives: `values`, a sequence of finite numbers in any order; `p`, a number.
    Returns: a float between min(values) and max(values). Raises ValueError (any message) when
        `values` is empty, and when `p` is below 0 or above 100 (0 and 100 themselves are fine).
    Leaves: `values` unchanged (a sorted copy is used).
    Uses: only Python: `sorted` and `math.floor`; no numpy.
    Checked: equals numpy.percentile on known lists; p50 of an even count is the mean of the two
        middle values; p99 of one sample is that sample; an empty list, p = -1 and p = 100.5 each
        raise ValueError (the type is checked, not the message).
    """
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile is in [0, 100], got {p}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("a percentile of no values: the run measured nothing")
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def stream_latencies(sent: float, chunks: Sequence[Tuple[float, int]]) -> Tuple[float, List[float]]:
    """Time to first token and the inter-token latencies of one streamed request.

    A chunk that carries no generated token (the first chunk of a chat stream, which only names
    the assistant's role; a last chunk with only a finish reason) is not a token: TTFT runs from
    the request being sent to the first chunk that carries one. Each later chunk with tokens adds
    one inter-token latency, the time since the previous chunk with tokens; a chunk of several
    tokens counts once, as one arrival (as sglang's and vLLM's bench_serving count it), so the
    first token's wait is never an ITL and bundled tokens add no zero gaps.

    Receives: `sent`, when the request was sent (seconds, the same clock as the chunks);
        `chunks`, (arrival time, tokens in the chunk) in order of arrival, tokens >= 0.
    Returns: (ttft, itls): ttft a float in seconds; itls one float per content chunk after the
        first, in order (empty when the tokens came in one chunk). Raises ValueError (any
        message) when no chunk carries a token, `chunks` empty included.
    Leaves: `chunks` unchanged.
    Uses: only Python: a list of the arrivals and `zip` for the gaps.
    Checked: TTFT skips a role-only first chunk; ITLs exclude the wait for the first token and the
        chunks without tokens; a stream without any token raises ValueError.
    """
    arrivals = [t for t, tokens in chunks if tokens > 0]
    if not arrivals:
        raise ValueError("the stream carried no token: no time to first token to measure")
    itls = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return arrivals[0] - sent, itls


def output_throughput(requests: Sequence[Tuple[float, float, int]], warmup: int = 0) -> float:
    """Output tokens per second of a run of concurrent requests, warm-up left out.

    The first `warmup` requests (in the order they were sent) only warm the server up: their
    tokens are not counted and their times do not bound the interval. The interval is the run's
    wall time, from the first counted request being sent to the last token of any counted request
    arriving: requests overlap, so adding their durations would count the same second many times.

    Receives: `requests`, (sent, last token received, output tokens) in order of sending, times in
        seconds on one clock; `warmup`, an int, as the caller gave it (not checked for you).
    Returns: output tokens / (latest last token - earliest sent), a float, among the counted
        requests. Raises ValueError (any message) when `warmup` is negative, when no request is
        left to count (none given, or `warmup` >= len(requests)), and when the span is zero or
        negative (a last token at or before the earliest send).
    Leaves: `requests` unchanged.
    Uses: only Python: `min`, `max` and `sum` over the counted requests.
    Checked: overlapping requests give tokens over the wall span, not over the summed durations;
        the span ends at the latest last token, whichever request it belongs to; warm-up requests
        change neither tokens nor span; each case above raises ValueError (the type is checked,
        not the message).
    """
    if warmup < 0:
        raise ValueError(f"warmup counts requests, got {warmup}")
    counted = list(requests)[warmup:]
    if not counted:
        raise ValueError(f"no request left after {warmup} warm-up ones: nothing to measure")
    start = min(sent for sent, _, _ in counted)
    end = max(last for _, last, _ in counted)
    if end <= start:
        raise ValueError(f"the run spans {end - start} s: its last token came before its start")
    return sum(tokens for _, _, tokens in counted) / (end - start)
