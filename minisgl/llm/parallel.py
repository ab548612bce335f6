"""`LLM(model, tp_size=N)`: the engine on N tensor-parallel ranks, one process each.

This process is rank 0: it owns the I/O (the caller's prompts and results, or a server's sockets)
and every scheduling decision, exactly as the one-process LLM does. Ranks 1..N-1 are processes of
their own (minisgl/llm/tp_worker.py) running the same scheduler, told each turn what rank 0's
received and which loop to run (minisgl/llm/lockstep.py), so every rank runs the same batches in
the same order; their model is their share of the heads and the vocabulary
(minisgl/models/sharding.py), and the collectives in it keep them together. Every rank samples
with the same seed from the same gathered logits, so every rank draws the same tokens (mini-sglang
#88: seeds differing across ranks): a `seed=None` run gets one random seed, chosen here for all.

A rank that raises or dies stops the whole group: the call that was running raises RankFailure
naming the rank and its error, within seconds, and no rank's process is left. So do Ctrl-C and
`shutdown()`. One tensor-parallel engine per process (torch.distributed's group is the process's).
"""

from __future__ import annotations

import random
import weakref
from dataclasses import fields
from pathlib import Path
from typing import List

import torch.distributed as dist

from minisgl.distributed import current
from minisgl.distributed.ranks import RankFailure, Ranks, timed_out
from minisgl.env import ENV
from minisgl.models import BUNDLED_MODEL, ModelConfig
from minisgl.models.sharding import check_tp_size
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import resolve_device

from .llm import LLM, model_directory
from .lockstep import LeaderIO, Lockstep
from .tp_worker import follow

__all__ = ["TensorParallelLLM", "TensorParallelScheduler", "RankFailure"]


def collective_backend(device) -> str:
    """The device group's backend: NCCL when each rank has a GPU of its own (device "cuda": rank r
    on GPU r), gloo on a CPU and when every rank shares the one GPU named ("cuda:0"), since NCCL
    refuses two ranks on one device ("Duplicate GPU detected") and gloo takes CUDA tensors."""
    return "nccl" if device.type == "cuda" and device.index is None else "gloo"


class RankZero(Lockstep):
    """Rank 0 of a group: starts the other ranks, tells them each turn what to do, stops them all
    when one fails. Mixed into the offline LLM and into the server's scheduler process."""

    def _start_ranks(self, model_dir: Path, tp_size: int, options: dict) -> dict:
        """Start ranks 1..tp_size-1 and join them; returns the options every rank builds with."""
        check_tp_size(ModelConfig.from_dir(model_dir), tp_size)
        if current().size > 1 or dist.is_initialized():
            raise RuntimeError(
                "this process already runs a tensor-parallel engine (or another torch.distributed "
                "group): shut it down first (llm.shutdown()); one per process"
            )
        options = dict(options, tp_size=tp_size)
        if options.get("seed", 0) is None:
            options["seed"] = random.randrange(2**31)  # one random seed, the same on every rank
        config = SchedulerConfig(model_path=model_dir, **options)  # bad options fail before spawn
        device = resolve_device(config.device)
        backend = collective_backend(device)
        if device.type == "cuda" and backend != "nccl" and config.use_cuda_graph:
            raise ValueError(  # the engine would refuse it in every rank; say so before spawning
                f"use_cuda_graph=True: CUDA graphs under tensor parallelism need NCCL, one GPU per "
                f"rank (device='cuda'); these {tp_size} ranks would share {device} over gloo, "
                "whose collectives a graph cannot capture"
            )
        switches = {name: switch.value for name, switch in vars(ENV).items()}
        self._stopped: str | None = None
        self._ranks = Ranks.start(tp_size, backend, follow, (model_dir, options, switches))
        # the ranks go with this object, or with the interpreter, whichever ends first
        self._finalizer = weakref.finalize(self, self._ranks.stop, False)
        return options

    @property
    def tp_size(self) -> int:
        return self._ranks.size

    @property
    def comm(self):
        """This rank's collectives, with their counts (minisgl/distributed/comm.py)."""
        return self._ranks.comm

    @property
    def rank_pids(self) -> List[int]:
        """The process ids of ranks 1..N-1."""
        return self._ranks.pids

    def step(self) -> None:
        self._check_running()
        try:
            self._ranks.control.broadcast(("step", self.overlap_now()))
            super().step()
        except BaseException as e:
            raise self._stopped_by(e) from e

    def _check_running(self) -> None:
        if self._stopped is not None:
            raise RuntimeError(
                f"this tensor-parallel LLM is stopped ({self._stopped}); build a new one"
            )

    def _stopped_by(self, error: BaseException) -> BaseException:
        """Stop every rank after `error`; the exception the caller gets."""
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            self._ranks.stop(graceful=False)
            self._stopped = f"stopped by {type(error).__name__}"
            return error
        report = self._ranks.failure(wait_s=3.0)
        self._ranks.stop(graceful=False)
        if report is None:
            report = f"rank 0 raised {type(error).__name__}: {error}"
        self._stopped = f"a rank failed: {report.splitlines()[0]}"
        failure = RankFailure(
            f"tensor parallelism over {self._ranks.size} ranks stopped, every rank ended: {report}"
        )
        failure.hung = timed_out(report)
        return failure


class TensorParallelScheduler(RankZero, Scheduler):
    """The server's scheduler process as rank 0 (serve --tp-size N): its sockets are rank 0's IO."""

    def __init__(self, config: SchedulerConfig, io) -> None:
        options = {f.name: getattr(config, f.name) for f in fields(config)}
        model_dir = Path(options.pop("model_path"))
        tp_size = options.pop("tp_size")
        options = self._start_ranks(model_dir, tp_size, options)
        try:
            super().__init__(SchedulerConfig(model_path=model_dir, **options), io)
        except BaseException as e:
            raise self._stopped_by(e) from e
        self.io = LeaderIO(io, self._ranks.control)


class TensorParallelLLM(RankZero, LLM):
    def __init__(self, model: str | Path = BUNDLED_MODEL, tp_size: int = 2, **options) -> None:
        model_dir = model_directory(model)
        options = self._start_ranks(model_dir, tp_size, options)
        try:
            super().__init__(model_dir, **options)
        except BaseException as e:
            raise self._stopped_by(e) from e
        self.io = LeaderIO(self._queue, self._ranks.control)

    def step(self) -> None:
        with self._lock:
            super().step()

    def _reset_to_idle(self, uids, error) -> None:
        super()._reset_to_idle(uids, error)
        if self._stopped is None:  # stopped outside a step (the progress bar): every rank resets
            self._ranks.control.broadcast(("reset",))

    def shutdown(self) -> None:
        """Finish the batch in flight, then end every rank. The LLM cannot be used after."""
        if self._stopped is not None:
            return
        super().shutdown()
        self._ranks.stop(graceful=True)
        self._stopped = "shut down"
