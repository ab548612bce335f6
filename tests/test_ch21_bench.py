"""Chapter 21: the measurement math of a serving benchmark (minisgl/bench/stats.py), judged on
streams and runs whose timings are known, so every figure has one right value.

- `percentile`: linear interpolation between the closest ranks, numpy's default;
- `stream_latencies`: TTFT from the first chunk with a token, ITLs between such chunks;
- `output_throughput`: output tokens over the run's wall span, warm-up requests left out.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from minisgl.bench.stats import output_throughput, percentile, stream_latencies

# percentile


def test_percentile_interpolates_between_the_closest_ranks():
    values = [10.0, 20.0, 30.0, 40.0]  # ranks 0..3
    assert percentile(values, 50) == pytest.approx(25.0)  # rank 1.5: halfway from 20 to 30
    assert percentile(values, 90) == pytest.approx(37.0)  # rank 2.7
    assert percentile(values, 99) == pytest.approx(39.7)  # rank 2.97, not the largest value
    assert percentile(values, 25) == pytest.approx(17.5)  # rank 0.75
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 40.0


def test_percentile_sorts_a_copy_and_equals_numpy_on_random_lists():
    rng = random.Random(0)
    for n in (2, 3, 7, 100, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        before = list(values)
        for p in (1, 33.3, 50, 95, 99, 99.9):
            assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))
        assert values == before


def test_percentile_of_an_odd_count_and_of_one_sample():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # the middle value, in any order
    assert percentile([0.25], 99) == 0.25  # one sample is every percentile of itself
    assert percentile([0.25], 0) == 0.25
    assert percentile([5.0, 5.0], 99) == 5.0


def test_percentile_of_nothing_or_outside_0_to_100_is_an_error():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    for p in (-1, 100.5):
        with pytest.raises(ValueError, match=r"\[0, 100\]"):
            percentile([1.0, 2.0], p)


# stream_latencies


def test_ttft_runs_to_the_first_chunk_with_a_token_skipping_the_role_chunk():
    # a chat stream: the role chunk at 1.05, the first token at 1.30, finish-only chunk at 1.90
    chunks = [(1.05, 0), (1.30, 1), (1.40, 1), (1.60, 1), (1.90, 0)]
    ttft, itls = stream_latencies(1.0, chunks)
    assert ttft == pytest.approx(0.30)
    assert itls == pytest.approx([0.10, 0.20])  # 1.30 -> 1.40 -> 1.60; the finish chunk adds none


def test_itls_exclude_the_wait_for_the_first_token():
    chunks = [(2.5, 1), (2.6, 1), (2.8, 1)]  # a completions stream: every chunk has a token
    ttft, itls = stream_latencies(2.0, chunks)
    assert ttft == pytest.approx(0.5)
    assert itls == pytest.approx([0.1, 0.2])
    assert len(itls) == 2  # three tokens, two gaps


def test_a_chunk_of_several_tokens_counts_as_one_arrival():
    chunks = [(0.2, 1), (0.5, 3), (0.6, 0), (0.9, 2)]
    ttft, itls = stream_latencies(0.0, chunks)
    assert ttft == pytest.approx(0.2)
    assert itls == pytest.approx([0.3, 0.4])  # no zero gaps for the bundled tokens


def test_a_stream_whose_first_chunk_carries_several_tokens():
    ttft, itls = stream_latencies(0.0, [(0.7, 4)])
    assert ttft == pytest.approx(0.7) and itls == []


def test_a_stream_without_a_token_is_an_error():
    for chunks in ([], [(1.0, 0), (1.2, 0)]):
        with pytest.raises(ValueError, match="no token"):
            stream_latencies(0.0, chunks)


# output_throughput


def test_throughput_is_tokens_over_the_wall_span_of_overlapping_requests():
    # three requests that overlap: sent at 0, 1, 2; last tokens at 4, 3, 6; 100 + 50 + 150 tokens
    run = [(0.0, 4.0, 100), (1.0, 3.0, 50), (2.0, 6.0, 150)]
    assert output_throughput(run) == pytest.approx(300 / 6.0)  # not 300 / (4 + 2 + 4)


def test_throughput_span_starts_at_the_earliest_send_and_ends_at_the_latest_token():
    run = [(5.0, 9.0, 40), (3.0, 7.0, 40), (4.0, 8.0, 40)]  # the latest token is the first's
    assert output_throughput(run) == pytest.approx(120 / 6.0)


def test_warmup_requests_count_neither_tokens_nor_time():
    warm = [(0.0, 10.0, 1000), (0.5, 0.8, 5)]
    run = [(20.0, 22.0, 60), (20.5, 24.0, 60)]
    assert output_throughput(warm + run, warmup=2) == pytest.approx(120 / 4.0)
    assert output_throughput(warm + run, warmup=0) == pytest.approx(1125 / 24.0)
    assert output_throughput(warm + run, warmup=1) == pytest.approx(125 / 23.5)


def test_throughput_of_nothing_or_of_no_time_is_an_error():
    with pytest.raises(ValueError, match="no request"):
        output_throughput([(0.0, 1.0, 5)], warmup=1)
    with pytest.raises(ValueError, match="no request"):
        output_throughput([])
    with pytest.raises(ValueError, match=r"spans 0\.0 s"):
        output_throughput([(2.0, 2.0, 5)])
    with pytest.raises(ValueError, match=r"spans -0\.5 s"):  # a last token before its send
        output_throughput([(2.0, 1.5, 5)])
    with pytest.raises(ValueError, match="warmup"):
        output_throughput([(0.0, 1.0, 5)], warmup=-1)
    assert math.isfinite(output_throughput([(0.0, 0.001, 1)]))
