"""classroom.ranks.run_ranks: a function on every rank of a forked gloo group (chapter 16's
try-outs and tests). A rank that raises is named with its error, a stub's NotImplementedError
comes back as itself, and a rank left waiting in a collective is named and killed in time."""

from __future__ import annotations

import time

import pytest
import torch

from classroom.ranks import RanksFailed, run_ranks


def _sum_of_ranks(comm):
    return comm.all_reduce(torch.tensor([float(comm.rank)])).item()


def test_every_rank_runs_the_function_in_one_group():
    assert run_ranks(3, _sum_of_ranks) == [3.0, 3.0, 3.0]


def _rank_one_raises(comm):
    if comm.rank == 1:
        raise ValueError("rank one's own error")
    return comm.all_reduce(torch.ones(1)).item()


def test_a_rank_that_raises_is_named_with_its_error():
    with pytest.raises(RanksFailed, match=r"^rank 1 raised ValueError: rank one's own error"):
        run_ranks(2, _rank_one_raises, timeout_s=20)


def _stub(comm):
    raise NotImplementedError("ch16.all_gather: write this function")


def test_a_stubs_error_comes_back_as_itself():
    with pytest.raises(NotImplementedError, match=r"^ch16\.all_gather: write this function$"):
        run_ranks(2, _stub)


def _only_rank_zero_reduces(comm):
    if comm.rank == 0:
        comm.all_reduce(torch.ones(1))
    return comm.rank


def test_a_rank_waiting_in_a_collective_another_never_called_is_named_in_time():
    start = time.monotonic()
    with pytest.raises(RanksFailed, match=r"rank 0 did not finish in 2 s \(finished: 1\)"):
        run_ranks(2, _only_rank_zero_reduces, timeout_s=2)
    assert time.monotonic() - start < 10


def test_a_bad_size_is_refused():
    with pytest.raises(ValueError, match="size must be a positive integer"):
        run_ranks(0, _sum_of_ranks)
