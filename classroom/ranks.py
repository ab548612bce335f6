"""A function run on every rank of a real gloo group, for chapter 16's try-outs and tests.

`run_ranks(size, fn, *args)` forks `size` processes, joins them in a torch.distributed gloo group
(a file store to meet, the loopback interface to talk), and runs `fn(comm, *args)` in each, with
`comm` that rank's `Collectives`; it returns every rank's result, rank 0's first. Forked, not
spawned: a rank starts as a copy of this process, so it runs the functions this process has, the
ones a notebook cell just defined or the judge just swapped in. (The engine's own ranks are
spawned, and run the judge's swap through MINISGL_SERVER_INIT instead: distributed/ranks.py.)

A rank that raises stops them all: `RanksFailed` carries its traceback (a NotImplementedError, an
exercise's stub, is raised as itself, so that a try-out's `attempt` recognises it). A rank that is
still running after `timeout_s` is killed with the others, and `RanksTimedOut` (a `RanksFailed`)
names it and the ranks that had finished: a rank left waiting in a collective that another rank
never called is the usual reason, and the message says so. Nothing of a rank outlives the call.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any, Callable, List

import torch
import torch.distributed as dist

from minisgl.distributed import Collectives


class RanksFailed(RuntimeError):
    """A rank raised, or did not finish in time; every rank has been stopped."""


class RanksTimedOut(RanksFailed):
    """A rank did not finish in time; every rank has been stopped. `hung` tells the judge
    (judge/timer.py) that the code under test hung where its sampler cannot see it, in another
    process: it counts as the test's timeout, and the exercise's other tests are not run."""

    hung = True


def run_ranks(
    size: int,
    fn: Callable[..., Any],
    *args: Any,
    collectives: type = Collectives,
    timeout_s: float = 30.0,
) -> List[Any]:
    """`fn(comm, *args)` on ranks 0..size-1 of a gloo group; their results, in rank order.
    `collectives` is the class each rank's `comm` is made of (a subclass with your method)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    if dist.is_initialized():
        raise RuntimeError(
            "this process is in a torch.distributed group already (a tensor-parallel LLM?): "
            "shut it down first, a forked rank would inherit the group"
        )
    # A file store, not a TCPStore: a TCPStore's server is a thread of this process, and a process
    # forked while another of its threads holds a lock may crash or hang in that lock.
    where = tempfile.mkdtemp(prefix="minisgl-ranks-")
    path = os.path.join(where, "store")
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for rank in range(size):
        receive, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_rank,
            args=(fn, args, collectives, rank, size, path, timeout_s, send),
            name=f"rank{rank}",
            daemon=True,
        )
        p.start()
        send.close()
        pipes.append(receive)
        procs.append(p)
    try:
        results = _collect(pipes, procs, timeout_s)
        # every rank answered: they may leave the group together
        dist.FileStore(path, -1).set("leave", "1")
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        for c in pipes:
            c.close()
        shutil.rmtree(where, ignore_errors=True)


def _collect(pipes, procs, timeout_s: float) -> List[Any]:
    results: dict = {}
    deadline = time.monotonic() + timeout_s
    waiting = dict(zip(pipes, range(len(pipes))))
    while waiting:
        ready = wait(list(waiting), timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            hung = sorted(waiting.values())
            done = sorted(results)
            raise RanksTimedOut(
                f"rank {', '.join(map(str, hung))} did not finish in {timeout_s:g} s "
                f"(finished: {', '.join(map(str, done)) or 'none'}); every rank was stopped. "
                "A rank left waiting in a collective that another rank never called (or called "
                "fewer times) looks like this."
            )
        for conn in ready:
            rank = waiting.pop(conn)
            try:
                kind, payload = pickle.loads(conn.recv_bytes())
            except EOFError:
                procs[rank].join(timeout=1.0)
                raise RanksFailed(
                    f"rank {rank} died (exit code {procs[rank].exitcode}) before it answered"
                ) from None
            if kind == "error":
                tb, stub = payload
                failed = RanksFailed(f"rank {rank} raised {tb.splitlines()[-1]}\n{tb}")
                if stub is not None:  # an exercise still its stub: its own error, as one process
                    raise NotImplementedError(stub) from failed
                raise failed
            results[rank] = payload
    return [results[r] for r in range(len(pipes))]


def _rank(fn, args, collectives, rank, size, path, timeout_s, send) -> None:
    """A forked rank: join the group, run `fn`, send back its result, leave without running
    anything of the parent's (no atexit handlers, no flushing of the parent's buffers)."""
    code = 0
    try:
        torch.set_num_threads(1)  # ranks share the cores; a forked OpenMP pool is unsafe anyway
        store = dist.FileStore(path, -1)
        # the group's own timeout is longer than the caller's: the caller names the hung rank
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=timeout_s + 30),
        )
        comm = collectives(rank, size, dist.group.WORLD)
        result = fn(comm, *args)
        send.send_bytes(pickle.dumps(("ok", result)))
        # Stay in the group until every rank has answered: a rank that left would break a
        # collective another rank still waits in, hiding which of them never arrived.
        store.wait(["leave"], timedelta(seconds=timeout_s + 30))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        stub = str(e) if isinstance(e, NotImplementedError) else None
        send.send_bytes(pickle.dumps(("error", (traceback.format_exc().rstrip(), stub))))
        code = 1
    finally:
        send.close()
        os._exit(code)
