"""Rank 0's side of the group: start the other ranks, meet them, notice a failure, stop them all.

Each other rank is a process started with `spawn` (a fresh interpreter that imports its entry
point by name, so it works from a script, a notebook or a server alike) running `rank_main`,
which joins the group and then runs `target`, an importable function. The ranks meet through a
TCPStore on 127.0.0.1 whose port the system chose; rank 0 waits for each rank to check in while
watching the processes, so a rank that cannot even start is reported at once, not after a timeout.

A rank that raises reports its traceback on a queue and exits; a rank that dies closes its
sockets. Either way the others' next collective fails at once (`CollectiveFailed`), and
`failure()` says which rank and why. `stop()` ends every rank, by asking, then by signal.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import re
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, List, Tuple

import torch.distributed as dist
import torch.multiprocessing as mp

from minisgl.env import TP_TIMEOUT

from .group import Control, join_group, leave_group

START_TIMEOUT_S = 120.0  # for every rank to start and check in


def collective_timeout_s() -> float:
    """How long a collective waits for a silent rank before raising (MINISGL_TP_TIMEOUT, 600 s by
    default: a step takes milliseconds, and loading a large checkpoint happens before the first
    collective that could wait for it). Each rank reads it; a spawned rank inherits the variable."""
    return float(TP_TIMEOUT.read())


class RankFailure(RuntimeError):
    """A rank of a tensor-parallel engine raised or died; every rank has been stopped. `hung` is
    true when a collective ran out of MINISGL_TP_TIMEOUT waiting for a rank: a rank that never
    came (the judge counts that as a timeout, judge/timer.py)."""

    hung = False


# how gloo ("Timed out waiting 20000ms for recv operation to complete") and NCCL's watchdog
# ("Watchdog caught collective operation timeout") say that a collective waited too long
_TIMED_OUT = re.compile(r"Timed out waiting \d+ ?ms|collective operation timeout")


def timed_out(report: str) -> bool:
    """Whether a rank's error report says a collective waited past its timeout."""
    return _TIMED_OUT.search(report) is not None


def rank_main(target: Callable, rank: int, size: int, port: int, backend: str, errors, args):
    """A rank other than 0: join the group, run `target(comm, control, *args)`, leave."""
    # Ctrl-C in a terminal reaches every process of the group; rank 0 decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGUSR1 prints every thread's stack to stderr (rank 0's): where a rank hangs, if it does
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        from minisgl.server.init import run_server_init

        # A spawned rank inherits nothing that its parent changed in memory: the hook puts the
        # same functions in place here as there (the judge's swap of the learner's code).
        run_server_init()
        store = dist.TCPStore(
            "127.0.0.1", port, size, False, timeout=timedelta(seconds=START_TIMEOUT_S)
        )
        store.set(f"joined/{rank}", "1")
        comm, control = join_group(store, rank, size, backend, collective_timeout_s())
        target(comm, control, *args)
        leave_group()
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        errors.close()
        errors.join_thread()  # the report must be out before the process is
        os._exit(1)  # now: the sockets close, and every peer's collective fails at once


class Ranks:
    def __init__(self, size: int, procs: List[Any], errors, comm, control: Control) -> None:
        self.size, self._procs, self._errors = size, procs, errors
        self.comm, self.control = comm, control
        self.running = True

    @classmethod
    def start(cls, size: int, backend: str, target: Callable, args: Tuple) -> "Ranks":
        """Ranks 1..size-1 started, and this process joined to them as rank 0."""
        ctx = mp.get_context("spawn")
        store = dist.TCPStore(
            "127.0.0.1",
            0,  # the system picks a free port, once
            size,
            True,
            timeout=timedelta(seconds=START_TIMEOUT_S),
            wait_for_workers=False,
        )
        errors = ctx.Queue()
        procs = [
            ctx.Process(
                target=rank_main,
                args=(target, rank, size, store.port, backend, errors, args),
                name=f"minisgl-tp-rank{rank}",
                daemon=True,  # never outlives this process
            )
            for rank in range(1, size)
        ]
        with _main_module_hidden():
            for p in procs:
                p.start()
        ranks = cls(size, procs, errors, None, None)
        try:
            ranks._wait_checked_in(store)
            ranks.comm, ranks.control = join_group(store, 0, size, backend, collective_timeout_s())
        except BaseException as e:
            ranks.stop(graceful=False)
            if isinstance(e, RankFailure):
                raise
            raise RankFailure(f"the {size} tensor-parallel ranks could not start: {e}") from e
        return ranks

    def _wait_checked_in(self, store) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        keys = [f"joined/{p.name.removeprefix('minisgl-tp-rank')}" for p in self._procs]
        while not store.check(keys):
            report = self.failure(wait_s=0.0)
            if report is not None:
                raise RankFailure(f"a tensor-parallel rank failed to start: {report}")
            if time.monotonic() > deadline:
                raise RankFailure(f"the tensor-parallel ranks did not start in {START_TIMEOUT_S}s")
            time.sleep(0.02)

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self._procs]

    def failure(self, wait_s: float = 3.0) -> str | None:
        """What went wrong with a rank: the traceback it reported, else how it died; None if every
        rank is alive and nothing was reported within `wait_s` seconds."""
        deadline = time.monotonic() + wait_s
        dead_since = None
        while True:
            try:
                rank, tb = self._errors.get(timeout=0.02)
                tb = tb.rstrip()
                return f"rank {rank} raised {tb.splitlines()[-1]}\n{tb}"
            except queue.Empty:
                pass
            dead = [p for p in self._procs if p.exitcode is not None and p.exitcode != 0]
            now = time.monotonic()
            if dead:
                dead_since = dead_since or now
                if now - dead_since > 0.5:  # its report, if it sent one, has had time to arrive
                    return "; ".join(_death(p) for p in dead)
            elif now > deadline:
                return None

    def stop(self, graceful: bool = True) -> None:
        """End every rank and leave the group. `graceful`: ask them first (they finish the command
        they run); else, or for one that does not stop, a signal."""
        if not self.running and not any(p.is_alive() for p in self._procs):
            return
        if graceful and self.running and self.control is not None:
            try:
                self.control.broadcast(("stop",))
            except Exception:  # noqa: BLE001 - a rank already gone: the signals below end the rest
                graceful = False
        self.running = False
        for p in self._procs:
            p.join(timeout=10.0 if graceful else 0.2)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=3.0)
            if p.is_alive():
                p.kill()
                p.join()
        leave_group()
        self._errors.close()
        self._errors.cancel_join_thread()


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start processes without the caller's main module: `spawn` runs a script's main module again
    in each new process (so a script without `if __name__ == "__main__":` would start ranks from
    its ranks), and a rank needs nothing from it: its entry point is minisgl's."""
    main = sys.modules["__main__"]
    saved = {
        name: main.__dict__.pop(name) for name in ("__file__", "__spec__") if name in main.__dict__
    }
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _death(p) -> str:
    code, rank = p.exitcode, p.name.removeprefix("minisgl-tp-rank")
    if code < 0:
        return f"rank {rank} was killed by {signal.Signals(-code).name}"
    return f"rank {rank} exited with code {code}"
