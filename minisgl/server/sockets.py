"""ZMQ sockets carrying message batches between the server's processes, and the scheduler's I/O.

Every process binds one PULL socket, its inbox, and connects a PUSH socket to each process it
sends to. PUSH/PULL keeps the order of one sender's frames, so a request's abort can never pass
the request itself on the way to the scheduler.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List

import zmq

from minisgl.message import BackendMsg, DetokenizeMsg, StatsQuery, StatsReply
from minisgl.message.wire import decode_batch, encode_batch

POLL_MS = 200  # how long an idle process waits for a frame before checking on its parent


def new_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    socket = ctx.socket(kind)
    # Linger 0: at exit, frames still queued for a peer that died are dropped. By default ZMQ keeps
    # a process alive until they are delivered, i.e. forever: a worker would outlive its server.
    socket.setsockopt(zmq.LINGER, 0)
    return socket


class Inbox:
    def __init__(self, ctx: zmq.Context, addr: str) -> None:
        self.socket = new_socket(ctx, zmq.PULL)
        self.socket.bind(addr)

    def drain(self, timeout_ms: int) -> List[Any]:
        """Every message waiting, after waiting up to `timeout_ms` for a first frame.

        One call drains the socket: a busy scheduler asks once a step, and a frame left behind
        would wait a whole step for nothing.

        Receives: `timeout_ms`, how long to wait for a first frame (0: not at all).
        Returns: the messages of every frame waiting, decoded, in arrival order; [] when no frame
            came in time.
        Leaves: those frames taken off the socket.
        Uses: `self.socket.poll(timeout_ms)` (0 when nothing came), `self.socket.recv(zmq.NOBLOCK)`
            (raises `zmq.Again` when no frame is left), `decode_batch` (ch12).
        Checked: several frames waiting come back from one call, in order, with no wait after the
            first frame (a socket that counts waits); nothing waiting gives []; a frame already
            waiting comes back with a zero timeout; a bad frame raises ValueError.
        """
        msgs: List[Any] = []
        if not self.socket.poll(timeout_ms):
            return msgs
        while True:
            try:
                frame = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return msgs
            msgs.extend(decode_batch(frame))


class Outbox:
    def __init__(self, ctx: zmq.Context, addr: str) -> None:
        self.socket = new_socket(ctx, zmq.PUSH)
        self.socket.connect(addr)

    def send(self, msgs: List[Any]) -> None:
        if msgs:
            self.socket.send(encode_batch(msgs))


class ParentWatch:
    """Ends a worker process whose parent, the API server, has gone (killed, say): a worker must not
    outlive the server. Polled between waits; os.getppid() changes when the parent dies."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def check(self) -> None:
        if os.getppid() != self.parent:
            raise SystemExit(0)


class ZmqSchedulerIO:
    """The scheduler's SchedulerIO over sockets: requests and aborts from the tokenizer worker's
    PUSH, tokens back to its inbox. A blocking receive (the scheduler has nothing to do) waits at
    most POLL_MS and may return nothing; the scheduler simply asks again. Stats queries are answered
    here, between steps, from `stats()`; the scheduler's loop never sees them."""

    def __init__(
        self,
        ctx: zmq.Context,
        inbox_addr: str,
        outbox_addr: str,
        stats: Callable[[], Dict[str, Any]] | None = None,
    ) -> None:
        self.inbox = Inbox(ctx, inbox_addr)
        self.outbox = Outbox(ctx, outbox_addr)
        self.stats = stats
        self.parent = ParentWatch()

    def receive(self, blocking: bool) -> List[BackendMsg]:
        """The messages for the scheduler that have arrived, waiting a little only when `blocking`.

        The scheduler calls it at the start of every step: with work to do it must not wait (the
        device would idle), with none it may (the loop would spin).

        Receives: `blocking`, True when the scheduler has nothing to run or handle.
        Returns: every UserMsg and AbortBackendMsg waiting, in arrival order; [] when none came
            (after at most POLL_MS when blocking, at once otherwise).
        Leaves: each StatsQuery among them answered with a StatsReply of `self.stats()` ({} when
            `self.stats` is None: the asker waits for a reply), sent to the tokenizer worker; the
            process ended (SystemExit), busy or idle, before any message is taken, if its parent
            has gone.
        Uses: `self.inbox.drain`, `self.outbox.send`, `self.parent.check`.
        Checked: requests and aborts come back in their order; only an idle scheduler waits (up to
            POLL_MS), a busy one not at all; stats queries are answered and not passed on, with {}
            without a stats source; a scheduler whose server died exits, busy or idle, without
            draining its inbox; the live server's tests run through it.
        """
        self.parent.check()
        msgs = self.inbox.drain(POLL_MS if blocking else 0)
        queries = [m for m in msgs if isinstance(m, StatsQuery)]
        if queries:
            stats = self.stats() if self.stats is not None else {}
            self.outbox.send([StatsReply(uid=q.uid, stats=stats) for q in queries])
        return [m for m in msgs if not isinstance(m, StatsQuery)]

    def send(self, msgs: List[DetokenizeMsg]) -> None:
        self.outbox.send(msgs)
