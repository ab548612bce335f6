"""The scheduler's I/O over ZMQ (minisgl/server/sockets.py), on sockets in a temporary directory:
what the scheduler receives, in which order, and the stats queries answered on the side."""

from __future__ import annotations

import pytest
import torch
import zmq

from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, DetokenizeMsg, StatsQuery, StatsReply, UserMsg
from minisgl.server.sockets import Inbox, Outbox, ZmqSchedulerIO


@pytest.fixture
def wired(tmp_path):
    """(the scheduler's io, the tokenizer worker's outbox to it, the worker's inbox)."""
    ctx = zmq.Context()
    to_scheduler, to_worker = f"ipc://{tmp_path}/scheduler", f"ipc://{tmp_path}/worker"
    worker_inbox = Inbox(ctx, to_worker)
    io = ZmqSchedulerIO(ctx, to_scheduler, to_worker, stats=lambda: {"slots_free": 3})
    yield io, Outbox(ctx, to_scheduler), worker_inbox
    ctx.destroy(linger=0)


def user(uid):
    return UserMsg(uid=uid, input_ids=torch.tensor([1, 2], dtype=torch.int32), sampling_params=SamplingParams())


def test_nothing_waiting_means_nothing_received(wired):
    io, _, _ = wired
    assert io.receive(blocking=False) == [], "with nothing sent, receive should return []"
    assert io.receive(blocking=True) == [], "a blocking receive with nothing sent should give up and return []"


def test_every_frame_waiting_is_received_in_order(wired):
    io, outbox, _ = wired
    outbox.send([user(1), user(2)])
    outbox.send([AbortBackendMsg(uid=1)])
    outbox.send([user(3)])
    got = []
    for _ in range(50):  # frames cross a socket: let them arrive
        got += io.receive(blocking=True)
        if len(got) >= 4:
            break
    assert [(type(m).__name__, m.uid) for m in got] == \
        [("UserMsg", 1), ("UserMsg", 2), ("AbortBackendMsg", 1), ("UserMsg", 3)], \
        f"expected the 4 messages of 3 frames in the order sent, got {[(type(m).__name__, m.uid) for m in got]}"


def test_stats_queries_are_answered_and_not_passed_on(wired):
    io, outbox, worker_inbox = wired
    outbox.send([StatsQuery(uid=9), user(1)])
    got = []
    for _ in range(50):
        got += io.receive(blocking=True)
        if got:
            break
    assert [type(m).__name__ for m in got] == ["UserMsg"], f"the scheduler should get only the request, got {[type(m).__name__ for m in got]}"
    replies = worker_inbox.receive(5000)
    assert replies == [StatsReply(uid=9, stats={"slots_free": 3})], f"expected the stats reply, got {replies}"


def test_sent_tokens_reach_the_worker(wired):
    io, _, worker_inbox = wired
    io.send([DetokenizeMsg(1, 5, False), DetokenizeMsg(2, 6, True)])
    got = worker_inbox.receive(5000)
    assert got == [DetokenizeMsg(1, 5, False), DetokenizeMsg(2, 6, True)], f"expected both tokens, got {got}"
