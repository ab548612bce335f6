"""What changes in a scheduler that runs in step with other tensor-parallel ranks.

Every rank runs the same Scheduler on the same messages, so each makes the same decisions: the
same batches, in the same order, the same page numbers (mini-sglang #113: decode order differing
across ranks). What must not differ, is told: rank 0 broadcasts the messages it receives
(`LeaderIO`) and which loop each turn runs (an environment switch read on rank 0 alone).

A failed step no longer fails only its batch: the ranks that did not fail are waiting inside a
collective of that step, so no rank can go on. It raises, and the group is stopped.
"""

from __future__ import annotations

from typing import Any, List

from minisgl.message import BackendMsg, DetokenizeMsg


class Lockstep:
    def _fail_batch(self, batch, error: Exception):
        raise error


class LeaderIO:
    """Rank 0's IO: its own (a queue, a server's sockets), every received message broadcast."""

    def __init__(self, inner: Any, control) -> None:
        self._inner, self._control = inner, control

    def receive(self, blocking: bool) -> List[BackendMsg]:
        msgs = self._inner.receive(blocking)
        self._control.broadcast(msgs)
        return msgs

    def send(self, msgs: List[DetokenizeMsg]) -> None:
        self._inner.send(msgs)


class FollowerIO:
    """Another rank's IO: rank 0's messages, in its order; replies are rank 0's to send."""

    def __init__(self, control) -> None:
        self._control = control

    def receive(self, blocking: bool) -> List[BackendMsg]:
        return self._control.broadcast()

    def send(self, msgs: List[DetokenizeMsg]) -> None:
        pass
