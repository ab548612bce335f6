"""Tensor parallelism's plumbing: the group of ranks (one process each) on torch.distributed.

- comm.py: `Collectives`, the facade the model and the engine call (all-reduce, all-gather,
  broadcast, the smallest of every rank's number), counting what it does; one per process.
- ranks.py: rank 0's side: start the other ranks, meet them on a loopback port, notice one that
  fails, stop them all.
- worker.py: the other ranks' side: build the same scheduler and follow rank 0's decisions.
"""

from .comm import (
    SINGLE,
    CollectiveFailed,
    Collectives,
    current,
    rank_device,
    set_current,
    tp_group,
)

__all__ = [
    "SINGLE",
    "CollectiveFailed",
    "Collectives",
    "current",
    "rank_device",
    "set_current",
    "tp_group",
]
