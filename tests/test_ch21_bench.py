"""Chapter 21: the measurement math of a serving benchmark (minisgl/bench/stats.py), judged on
streams and runs whose timings are known, so every figure has one right value.

- `percentile`: linear interpolation between the closest ranks, numpy's default;
- `stream_latencies`: TTFT from the first chunk with a token, ITLs between such chunks;
- `output_throughput`: output tokens over the run's wall span, warm-up requests left out.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

import numpy as np
import pytest

from minisgl.bench.stats import output_throughput, percentile, stream_latencies

# what a failing test says: the rule, what was expected and what came, on one line


def call(fn, *args, **kwargs) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{fn.__name__}({', '.join(shown)})"


def assert_near(got, want: float, what: str, rel: float = 1e-6, abs_: float = 1e-9) -> None:
    ok = isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=rel, abs_tol=abs_)
    assert ok, f"{what}: expected {want!r}, got {got!r}"


def assert_gaps(got, want: Sequence[float], what: str) -> None:
    ok = len(got) == len(want) and all(math.isclose(g, w, abs_tol=1e-9) for g, w in zip(got, want))
    assert ok, f"{what}: expected ITLs {list(want)}, got {list(got)}"


def assert_value_error(why: str, fn, *args, **kwargs) -> None:
    """`fn(*args, **kwargs)` must raise ValueError, with any message (the contract names only the
    type); the failure names the call, the rule and what came instead."""
    try:
        got = fn(*args, **kwargs)
    except ValueError:
        return
    except NotImplementedError:
        raise  # a stub is not a refusal
    except Exception as e:
        came = f"it raised {type(e).__name__}: {e}"
    else:
        came = f"it returned {got!r}"
    pytest.fail(f"{call(fn, *args, **kwargs)}: {why}, so ValueError expected; {came}")


# percentile

VALUES = [10.0, 20.0, 30.0, 40.0]  # ranks 0..3


def test_percentile_interpolates_between_the_closest_ranks():
    for p, want, why in (
        (50, 25.0, "rank 1.5: halfway from 20 to 30"),
        (90, 37.0, "rank 2.7: 70 % of the way from 30 to 40"),
        (99, 39.7, "rank 2.97: not the largest value"),
        (25, 17.5, "rank 0.75: 75 % of the way from 10 to 20"),
        (0, 10.0, "p0 is the smallest value"),
        (100, 40.0, "p100 is the largest value"),
    ):
        assert_near(percentile(VALUES, p), want, f"{call(percentile, VALUES, p)}, {why}")


def test_percentile_sorts_a_copy_and_equals_numpy_on_random_lists():
    rng = random.Random(0)
    for n in (2, 3, 7, 100, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        before = list(values)
        for p in (1, 33.3, 50, 95, 99, 99.9):
            want = float(np.percentile(values, p))
            assert_near(
                percentile(values, p), want, f"p{p} of {n} random values, as numpy.percentile"
            )
        assert values == before, f"percentile of {n} values changed its input (sort a copy)"


def test_percentile_of_an_odd_count_and_of_one_sample():
    for values, p, want, why in (
        ([3.0, 1.0, 2.0], 50, 2.0, "the middle value, in any order"),
        ([0.25], 99, 0.25, "one sample is every percentile of itself"),
        ([0.25], 0, 0.25, "one sample is every percentile of itself"),
        ([5.0, 5.0], 99, 5.0, "equal values"),
    ):
        assert_near(percentile(values, p), want, f"{call(percentile, values, p)}, {why}")


def test_percentile_of_nothing_or_outside_0_to_100_is_an_error():
    assert_value_error("a percentile of no values is an error", percentile, [], 50)
    for p in (-1, 100.5):
        assert_value_error(f"p = {p} is outside [0, 100]", percentile, [1.0, 2.0], p)


# stream_latencies


def test_ttft_runs_to_the_first_chunk_with_a_token_skipping_the_role_chunk():
    # a chat stream: the role chunk at 1.05, the first token at 1.30, finish-only chunk at 1.90
    chunks = [(1.05, 0), (1.30, 1), (1.40, 1), (1.60, 1), (1.90, 0)]
    ttft, itls = stream_latencies(1.0, chunks)
    what = f"sent at 1.0, chunks {chunks}"
    assert_near(ttft, 0.30, f"{what}: TTFT runs to the first chunk with a token, not the role's")
    assert_gaps(itls, [0.10, 0.20], f"{what}: 1.30 -> 1.40 -> 1.60; the finish chunk adds none")


def test_itls_exclude_the_wait_for_the_first_token():
    chunks = [(2.5, 1), (2.6, 1), (2.8, 1)]  # a completions stream: every chunk has a token
    ttft, itls = stream_latencies(2.0, chunks)
    what = f"sent at 2.0, chunks {chunks}"
    assert_near(ttft, 0.5, f"{what}: TTFT")
    assert_gaps(itls, [0.1, 0.2], f"{what}: three tokens, two gaps, the wait for the first not one")


def test_a_chunk_of_several_tokens_counts_as_one_arrival():
    chunks = [(0.2, 1), (0.5, 3), (0.6, 0), (0.9, 2)]
    ttft, itls = stream_latencies(0.0, chunks)
    what = f"sent at 0.0, chunks {chunks}"
    assert_near(ttft, 0.2, f"{what}: TTFT")
    assert_gaps(
        itls,
        [0.3, 0.4],
        f"{what}: a chunk of several tokens is one arrival (no zero gaps), a gap runs from the "
        "previous chunk with tokens",
    )


def test_a_stream_whose_first_chunk_carries_several_tokens():
    ttft, itls = stream_latencies(0.0, [(0.7, 4)])
    what = "sent at 0.0, one chunk [(0.7, 4)]"
    assert_near(ttft, 0.7, f"{what}: TTFT")
    assert_gaps(itls, [], f"{what}: one arrival, no gap")


def test_a_stream_without_a_token_is_an_error():
    for chunks in ([], [(1.0, 0), (1.2, 0)]):
        assert_value_error("a stream without a token has no TTFT", stream_latencies, 0.0, chunks)


# output_throughput


def test_throughput_is_tokens_over_the_wall_span_of_overlapping_requests():
    # three requests that overlap: sent at 0, 1, 2; last tokens at 4, 3, 6; 100 + 50 + 150 tokens
    run = [(0.0, 4.0, 100), (1.0, 3.0, 50), (2.0, 6.0, 150)]
    assert_near(
        output_throughput(run),
        300 / 6.0,
        f"{call(output_throughput, run)}: 300 tokens over the wall span 0 -> 6 s, not over the "
        "summed durations (10 s)",
    )


def test_throughput_span_starts_at_the_earliest_send_and_ends_at_the_latest_token():
    run = [(5.0, 9.0, 40), (3.0, 7.0, 40), (4.0, 8.0, 40)]  # the latest token is the first's
    assert_near(
        output_throughput(run),
        120 / 6.0,
        f"{call(output_throughput, run)}: the span runs from the earliest send (3 s) to the "
        "latest last token (9 s), whichever requests they belong to",
    )


def test_warmup_requests_count_neither_tokens_nor_time():
    warm = [(0.0, 10.0, 1000), (0.5, 0.8, 5)]
    run = [(20.0, 22.0, 60), (20.5, 24.0, 60)]
    for warmup, want, why in (
        (2, 120 / 4.0, "120 tokens over 20 -> 24 s"),
        (0, 1125 / 24.0, "every request counted: 1125 tokens over 0 -> 24 s"),
        (1, 125 / 23.5, "the first request left out: 125 tokens over 0.5 -> 24 s"),
    ):
        got = output_throughput(warm + run, warmup=warmup)
        assert_near(got, want, f"{call(output_throughput, warm + run, warmup=warmup)}: {why}")


def test_throughput_of_nothing_or_of_no_time_is_an_error():
    for why, requests, warmup in (
        ("no request left after the warm-up", [(0.0, 1.0, 5)], 1),
        ("no request at all", [], 0),
        ("a span of zero seconds", [(2.0, 2.0, 5)], 0),
        ("a span below zero (a last token before its send)", [(2.0, 1.5, 5)], 0),
        ("a negative warm-up count", [(0.0, 1.0, 5)], -1),
    ):
        assert_value_error(why, output_throughput, requests, warmup=warmup)
    tiny = output_throughput([(0.0, 0.001, 1)])
    assert math.isfinite(tiny), f"a span of 1 ms gives a finite figure, got {tiny!r}"
