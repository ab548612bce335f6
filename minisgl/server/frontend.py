"""The API server's side of the sockets: it hands requests to the tokenizer worker and routes each
reply to the request it belongs to.

Every request gets a uid and an asyncio queue; a listener task reads the worker's frames and puts
each reply on its request's queue. A request whose client went away is released with an abort,
which travels to the scheduler (Scheduler._abort, minisgl/scheduler/lifecycle.py) and gives its
slot and pages back.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Dict

import zmq
import zmq.asyncio

from minisgl.message import AbortMsg, StatsQuery, UserReply
from minisgl.message.wire import decode_batch, encode_batch

from .sockets import new_socket


class Frontend:
    def __init__(self, inbox_addr: str, worker_addr: str) -> None:
        self._ctx = zmq.asyncio.Context()
        self._inbox = new_socket(self._ctx, zmq.PULL)
        self._inbox.bind(inbox_addr)
        # Sends go through a plain socket: a PUSH to a connected peer does not block, and a plain
        # send can be made from a `finally` of a cancelled task, where an await could not.
        self._sync_ctx = zmq.Context()
        self._outbox = new_socket(self._sync_ctx, zmq.PUSH)
        self._outbox.connect(worker_addr)
        self._uids = itertools.count()
        self._queues: Dict[int, asyncio.Queue] = {}
        self.failure: str | None = None  # why the server cannot serve any more (a worker died)
        self.metrics = None  # a ServerMetrics (metrics.py), told of every request and reply

    @property
    def pending(self) -> int:
        return len(self._queues)

    def submit(self, make_msg: Callable[[int], Any]) -> int:
        """Send the message `make_msg(uid)` for a new request; returns the uid."""
        uid = next(self._uids)
        self._queues[uid] = asyncio.Queue()
        if self.metrics is not None:
            self.metrics.submitted(uid)
        if self.failure is not None:
            self._queues[uid].put_nowait(self._failed_reply(uid))
        else:
            self._outbox.send(encode_batch([make_msg(uid)]))
        return uid

    async def next_reply(self, uid: int) -> Any:
        return await self._queues[uid].get()

    def release(self, uid: int, abort: bool) -> None:
        """Forget request `uid`; `abort`: it has not finished, so the scheduler must stop it."""
        if self.metrics is not None:
            self.metrics.released(uid)
        if self._queues.pop(uid, None) is not None and abort and self.failure is None:
            self._outbox.send(encode_batch([AbortMsg(uid=uid)]))

    async def stats(self, timeout: float = 10.0) -> Dict[str, Any]:
        uid = self.submit(lambda u: StatsQuery(uid=u))
        try:
            reply = await asyncio.wait_for(self.next_reply(uid), timeout)
        finally:
            self.release(uid, abort=False)
        if isinstance(reply, UserReply):  # the server failed meanwhile
            raise RuntimeError(reply.error)
        return reply.stats

    async def listen(self) -> None:
        """Route the worker's replies to their requests (runs for the server's lifetime)."""
        while True:
            frame = await self._inbox.recv()
            for reply in decode_batch(frame):
                queue = self._queues.get(reply.uid)
                if queue is not None:  # else released: its client is gone
                    queue.put_nowait(reply)
                    if self.metrics is not None and isinstance(reply, UserReply):
                        self.metrics.replied(reply.uid, reply)

    def fail(self, reason: str) -> None:
        """A worker process died: answer every request in flight, and every later one, with a
        500."""
        if self.failure is None:
            self.failure = reason
            for uid, queue in self._queues.items():
                queue.put_nowait(self._failed_reply(uid))

    def _failed_reply(self, uid: int) -> UserReply:
        return UserReply(
            uid=uid, finished=True, error=f"the server cannot serve: {self.failure}", status=500
        )

    def close(self) -> None:
        self._inbox.close(linger=0)
        self._outbox.close(linger=0)
        self._ctx.term()
        self._sync_ctx.term()
