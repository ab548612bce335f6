"""Joining the group: the same few calls on every rank, in the same order.

The ranks meet through a TCPStore on the loopback interface whose port rank 0 had the system
choose (port 0), once; nothing listens beyond this machine. Two process groups come out of it:

- the device group (gloo on a CPU, NCCL on CUDA GPUs) for the model's collectives, with a timeout
  of `timeout_s` (a step takes milliseconds; a rank silent that long is stuck);
- the control group (always gloo) on which rank 0 broadcasts its decisions. A rank waits there
  for as long as rank 0 has nothing to run, so its timeout is long; a rank that dies still closes
  its sockets, which every peer notices at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .comm import CollectiveFailed, Collectives, set_current

# how long a rank may wait for rank 0's next decision: an idle engine (a notebook left open)
CONTROL_TIMEOUT = timedelta(days=7)


class Control:
    """Rank 0's decisions, broadcast to every rank in the order rank 0 makes them."""

    def __init__(self, group, rank: int) -> None:
        self._group, self.rank = group, rank

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0: send `obj` to every rank; the others: return what rank 0 sent."""
        box = [obj]
        try:
            dist.broadcast_object_list(box, src=0, group=self._group)
        except RuntimeError as e:
            raise CollectiveFailed(f"broadcast of rank 0's decision failed: {e}") from e
        return box[0]


def join_group(store, rank: int, size: int, backend: str, timeout_s: float):
    """This process's place in the group: (its Collectives, the Control channel). Sets the
    process's current Collectives (comm.current), which the engine picks up."""
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s)
    )
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    comm = Collectives(rank, size, dist.group.WORLD, cpu_group=control)
    set_current(comm)
    return comm, Control(control, rank)


def leave_group() -> None:
    """Tear this process's groups down (a no-op when it is in none)."""
    from .comm import SINGLE

    set_current(SINGLE)
    if dist.is_initialized():
        dist.destroy_process_group()
