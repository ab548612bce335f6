"""The collectives a tensor-parallel model needs, behind one small facade.

A model built for `size` ranks calls `all_reduce` after each row-parallel projection and after the
vocabulary-parallel embedding, `all_gather` once in the LM head; the engine calls `broadcast` so
every rank continues with rank 0's sampled tokens, and `all_min` so every rank's KV pool has the
same number of pages. With one rank each of them is the identity and costs nothing.

The facade counts each kind of collective and the seconds spent in them (wall clock: on a GPU the
time to enqueue, not to run), so a test can check 2 * layers + 1 all-reduces per forward and the
benchmark can report the share of time in communication.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator, List

import torch


class CollectiveFailed(RuntimeError):
    """A collective raised: a rank is gone (or its group broke). No step can run any more."""


class Collectives:
    def __init__(self, rank: int = 0, size: int = 1, group=None, cpu_group=None) -> None:
        self.rank, self.size = rank, size
        self._group = group  # the device's process group (gloo or NCCL); None with one rank
        self._cpu_group = cpu_group  # a gloo group, for numbers that live on the host
        self.counts: Counter = Counter()
        self.seconds = 0.0

    @property
    def capturable(self) -> bool:
        """Whether a CUDA graph can capture this group's collectives: with one rank (there are
        none) or on NCCL; gloo's CUDA collectives copy through the host, which a graph cannot."""
        if self.size == 1:
            return True
        import torch.distributed as dist

        return dist.get_backend(self._group) == "nccl"

    def reset_counts(self) -> None:
        self.counts.clear()
        self.seconds = 0.0

    @contextmanager
    def _timed(self, kind: str) -> Iterator[None]:
        self.counts[kind] += 1
        start = time.perf_counter()
        try:
            yield
        except RuntimeError as e:  # gloo and NCCL raise RuntimeError for a peer that is gone
            # which rank waited, in which collective: a rank that never arrives (or called one
            # collective fewer) shows as its peers' timeout here
            raise CollectiveFailed(
                f"rank {self.rank}: {kind} #{self.counts[kind]} across {self.size} ranks "
                f"failed: {e}"
            ) from e
        finally:
            self.seconds += time.perf_counter() - start

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x`, in place (and returned)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        with self._timed("all_reduce"):
            dist.all_reduce(x, group=self._group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `x` concatenated along `dim`, rank 0's first.

        Each piece is gathered whole and joined along `dim`: gathering into one flat tensor and
        reshaping it would interleave the rows of a batch (mini-sglang #98).

        Receives: `x`, this rank's piece (the same shape on every rank; it may be a view that is
            not contiguous); `dim`, the dimension to join along (the LM head's vocabulary: -1).
        Returns: a new tensor, `x`'s shape with `dim` `self.size` times as long: rank r's piece
            at positions [r * n, (r + 1) * n) along `dim`. With one rank, `x` itself.
        Leaves: `x` unchanged; the count of all-gathers one higher (with more than one rank).
        Uses: `torch.distributed.all_gather` on `self._group` (NCCL takes contiguous tensors
            only); `self._timed("all_gather")`, which counts and times it; `torch.cat`.
        Checked: each row's pieces joined in rank order for a batch of several rows on 2 and 4
            ranks; along the first dimension too; a non-contiguous piece; counted once; one rank
            returns its input without touching a group; TP=2 greedy tokens equal transformers'
            for a batch of prompts.
        """
        if self.size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()  # NCCL takes contiguous tensors only (gloo copies a view itself)
        parts: List[torch.Tensor] = [torch.empty_like(x) for _ in range(self.size)]
        with self._timed("all_gather"):
            dist.all_gather(parts, x, group=self._group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank `src`'s `x` on every rank, in place (and returned)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        with self._timed("broadcast"):
            dist.broadcast(x, src=src, group=self._group)
        return x

    def all_min(self, value: int) -> int:
        """The smallest of every rank's `value` (the KV pages each rank's memory allows)."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        with self._timed("all_min"):
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._cpu_group)
        return int(t.item())


SINGLE = Collectives()
_current: Collectives = SINGLE


def current() -> Collectives:
    """This process's tensor-parallel group (SINGLE outside one)."""
    return _current


def set_current(comm: Collectives) -> None:
    global _current
    _current = comm


def tp_group(tp_size: int) -> Collectives:
    """The group an engine of `tp_size` ranks computes in: SINGLE for one, else this process's
    group, which LLM(tp_size=N) (or a worker) joined before building the engine."""
    if tp_size == 1:
        return SINGLE
    if _current.size != tp_size:
        raise RuntimeError(
            f"tp_size={tp_size}: this process is in no group of {tp_size} ranks; build the engine "
            f"through LLM(model, tp_size={tp_size}) (or serve --tp-size {tp_size}), which starts "
            "the ranks"
        )
    return _current


def rank_device(device: torch.device, comm: Collectives) -> torch.device:
    """Rank r's device: the CPU, GPU r (one GPU per rank) when the engine asked for "cuda", or the
    one GPU named ("cuda:0"), which every rank then shares (over gloo: collective_backend in
    minisgl/llm/parallel.py)."""
    if comm.size == 1 or device.type != "cuda" or device.index is not None:
        return device
    if comm.rank >= torch.cuda.device_count():
        raise RuntimeError(
            f"tp_size={comm.size} needs one GPU per rank: torch sees {torch.cuda.device_count()}"
        )
    torch.cuda.set_device(comm.rank)
    return torch.device("cuda", comm.rank)
