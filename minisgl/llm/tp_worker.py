"""A tensor-parallel rank other than 0: the same scheduler as rank 0's, doing what rank 0 says.

Rank 0 broadcasts one command per turn: ("step", overlap) runs one turn of the loop rank 0 chose
(its messages follow from `LeaderIO`), ("reset",) puts the scheduler back to idle as rank 0's was
after an interrupted generate, ("stop",) ends the rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from minisgl.env import ENV
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.reset import reset_to_idle

from .lockstep import FollowerIO, Lockstep


class Follower(Lockstep, Scheduler):
    told_overlap = False

    def overlap_now(self) -> bool:
        return self.told_overlap


def follow(comm, control, model_dir: Path, options: Dict[str, Any], env: Dict[str, Any]) -> None:
    """Rank `comm.rank`'s life: build the engine (collectives with rank 0's as it builds its own),
    then follow rank 0's commands until it says stop."""
    for name, value in env.items():  # rank 0's switches, as tests and notebooks set them
        getattr(ENV, name).value = value
    follower = Follower(SchedulerConfig(model_path=model_dir, **options), FollowerIO(control))
    while True:
        command = control.broadcast()
        kind = command[0]
        if kind == "step":
            follower.told_overlap = command[1]
            follower.step()
        elif kind == "reset":
            reset_to_idle(follower)
        elif kind == "stop":
            follower.engine.synchronize()
            return
        else:
            raise ValueError(f"rank {comm.rank}: unknown command from rank 0: {command!r}")
