"""How the scheduler talks to the outside: it receives BackendMsgs and sends DetokenizeMsgs through
an IO object. The offline LLM uses an in-process queue; an online server would use sockets."""

from __future__ import annotations

from collections import deque
from typing import Callable, Deque, List, Protocol

from minisgl.message import BackendMsg, DetokenizeMsg


class SchedulerIO(Protocol):
    def receive(self, blocking: bool) -> List[BackendMsg]: ...

    def send(self, msgs: List[DetokenizeMsg]) -> None: ...


class QueueIO:
    """In-process IO: `put` queues a message for the scheduler; replies go to `on_reply`."""

    def __init__(self, on_reply: Callable[[List[DetokenizeMsg]], None]) -> None:
        self._inbox: Deque[BackendMsg] = deque()
        self._on_reply = on_reply

    def put(self, msg: BackendMsg) -> None:
        self._inbox.append(msg)

    @property
    def pending(self) -> int:
        """Messages put but not yet received by the scheduler."""
        return len(self._inbox)

    def clear(self) -> None:
        self._inbox.clear()

    def drop(self, uid: int) -> bool:
        """Take request `uid`'s messages out of the queue; True if there were any."""
        kept = [m for m in self._inbox if getattr(m, "uid", None) != uid]
        dropped = len(kept) != len(self._inbox)
        self._inbox = deque(kept)
        return dropped

    def receive(self, blocking: bool) -> List[BackendMsg]:
        # Offline there is nobody to wait for: a blocking receive with an empty inbox returns
        # nothing.
        msgs = list(self._inbox)
        self._inbox.clear()
        return msgs

    def send(self, msgs: List[DetokenizeMsg]) -> None:
        if msgs:
            self._on_reply(msgs)
