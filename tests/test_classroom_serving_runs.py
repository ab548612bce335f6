"""classroom/serving_runs.py reads the dated bench_serve.py runs chapter 21 quotes and plots."""

from __future__ import annotations

import math

import pytest

from classroom import serving_runs


def test_the_h200_run_is_read_row_by_row():
    run = serving_runs.read_run(serving_runs.RESULTS / "2026-11-30-h200-bench-serve.txt")
    assert run.offline_tok_s == 7452
    assert run.rates == [4, 16, 64, math.inf]
    assert run.tok_s == [165, 656, 2574, 4684]
    assert run.ttft_ms[-1] == (761.5, 1789.7) and run.itl_ms[2] == (1.6, 62.7)
    assert "H200" in run.header


def test_the_notes_after_the_table_are_not_rows():
    run = serving_runs.read_run(serving_runs.RESULTS / "2026-11-30-cpu-bench-serve.txt")
    assert run.rates == [2, 8, math.inf]  # the '#' lines below repeat figures in prose
    assert run.offline_tok_s == 1717


def test_a_file_that_is_not_a_bench_serve_run_says_so(tmp_path):
    other = serving_runs.RESULTS / "2026-12-01-cpu-throughput.txt"
    with pytest.raises(ValueError, match="not a bench_serve run"):
        serving_runs.read_run(other)
    empty = tmp_path / "run.txt"
    empty.write_text("# a header\noffline LLM.generate: 10 output tok/s\n")
    with pytest.raises(ValueError, match="no rows"):
        serving_runs.read_run(empty)
