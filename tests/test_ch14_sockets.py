"""Chapter 14: the scheduler's I/O over ZMQ sockets and the watchdog (minisgl/server/sockets.py,
launcher.py). Sockets are `inproc://` ones of one context, so a frame sent is waiting at once and no
test depends on timing; the live server's tests (tests/test_server_*.py) cover the same code across
processes."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch
import zmq

from classroom.frame_socket import FrameSocket
from classroom.loop_check import LoopCheck, Proc
from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, DetokenizeMsg, StatsQuery, StatsReply, UserMsg
from minisgl.message.wire import encode_batch
from minisgl.server import launcher
from minisgl.server.sockets import POLL_MS, Inbox, Outbox, ZmqSchedulerIO
from refusals import refuses

_count = iter(range(10**6))


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def addr(name: str) -> str:
    return f"inproc://{name}-{next(_count)}"


def user(uid):
    return UserMsg(
        uid=uid, input_ids=torch.tensor([1, 2], dtype=torch.int32), sampling_params=SamplingParams()
    )


def names(msgs):
    return [(type(m).__name__, m.uid) for m in msgs]


# ---------------------------------------------------------------------------------------- Inbox


def test_one_drain_takes_every_frame_waiting_in_order(ctx):
    where = addr("inbox")
    inbox, outbox = Inbox(ctx, where), Outbox(ctx, where)
    outbox.send([user(1), user(2)])
    outbox.send([AbortBackendMsg(uid=1)])
    outbox.send([user(3)])
    got = inbox.drain(0)
    assert names(got) == [("UserMsg", 1), ("UserMsg", 2), ("AbortBackendMsg", 1), ("UserMsg", 3)], (
        f"3 frames waiting: one drain should return their 4 messages in order, got {names(got)}"
    )
    assert inbox.drain(0) == [], "the frames should be taken off the socket"


def test_nothing_waiting_gives_nothing(ctx):
    inbox = Inbox(ctx, addr("inbox"))
    assert inbox.drain(0) == [], "with nothing sent, drain(0) should return []"
    assert inbox.drain(1) == [], "with nothing sent, drain(1) should return [] after waiting"


def test_an_idle_wait_ends_when_a_frame_comes(ctx):
    """drain(timeout) waits for a first frame: one sent while it waits is returned by that call."""
    import threading

    where = addr("inbox")
    inbox, outbox = Inbox(ctx, where), Outbox(ctx, where)
    later = threading.Timer(0.05, lambda: outbox.send([user(7)]))
    later.start()
    # long enough for a busy machine to send it; short, since a drain that waits again after the
    # frame comes back only at the timeout (the test after this one catches that)
    got = inbox.drain(3_000)
    later.join()
    assert names(got) == [("UserMsg", 7)], (
        f"a frame sent while drain waits should be returned by it, got {names(got)}"
    )


def test_frames_already_waiting_are_taken_without_waiting_again(ctx):
    """drain waits only for a first frame: once one is there, the others already waiting are taken
    and nothing more is waited for (a frame arriving later belongs to the next step). The socket
    counts waits instead of taking time (classroom/frame_socket.py)."""
    inbox = Inbox(ctx, addr("inbox"))
    frames = [encode_batch([user(1), user(2)]), encode_batch([AbortBackendMsg(uid=1)])]
    inbox.socket = socket = FrameSocket(frames + [encode_batch([user(3)])])
    got = inbox.drain(POLL_MS)
    assert names(got) == [("UserMsg", 1), ("UserMsg", 2), ("AbortBackendMsg", 1), ("UserMsg", 3)], (
        f"3 frames waiting: drain({POLL_MS}) should return their 4 messages in order, got "
        f"{names(got)}"
    )
    assert socket.waits == [], (
        f"with frames already waiting, drain({POLL_MS}) should take them all and wait no more, but "
        f"it waited again (poll timeouts, in ms, that found no frame: {socket.waits}): an idle "
        f"scheduler would sit {POLL_MS} ms on every request it gets. Poll once, for the first "
        "frame; then recv(zmq.NOBLOCK) until zmq.Again"
    )


def test_a_bad_frame_raises(ctx):
    where = addr("inbox")
    inbox = Inbox(ctx, where)
    raw = ctx.socket(zmq.PUSH)
    raw.connect(where)
    raw.send(b"not a frame")
    with refuses(ValueError, "drain(0) of a frame b'not a frame'"):
        inbox.drain(0)
    raw.close(linger=0)


# ------------------------------------------------------------------------------- ZmqSchedulerIO


@pytest.fixture
def wired(ctx):
    """(the scheduler's io, the tokenizer worker's outbox to it, the worker's inbox)."""
    to_scheduler, to_worker = addr("scheduler"), addr("worker")
    worker_inbox = Inbox(ctx, to_worker)
    io = ZmqSchedulerIO(ctx, to_scheduler, to_worker, stats=lambda: {"slots_free": 3})
    return io, Outbox(ctx, to_scheduler), worker_inbox


def test_the_scheduler_receives_requests_and_aborts_in_order(wired):
    io, outbox, _ = wired
    outbox.send([user(1), AbortBackendMsg(uid=1)])
    outbox.send([user(2)])
    got = io.receive(blocking=False)
    assert names(got) == [("UserMsg", 1), ("AbortBackendMsg", 1), ("UserMsg", 2)], (
        f"a busy scheduler's receive should return everything waiting, in order, got {names(got)}"
    )
    assert io.receive(blocking=True) == [], (
        "with nothing waiting, a blocking receive gives up and returns []"
    )


class Recorder:
    """An inbox that notes how long it was asked to wait."""

    def __init__(self):
        self.waits = []

    def drain(self, timeout_ms):
        self.waits.append(timeout_ms)
        return []


def test_only_an_idle_scheduler_waits_for_messages(wired):
    io, _, _ = wired
    io.inbox = Recorder()
    io.receive(blocking=False)
    io.receive(blocking=True)
    assert io.inbox.waits[0] == 0, (
        "a scheduler with work must not wait for messages (the device would idle): it asked "
        f"to wait {io.inbox.waits[0]} ms"
    )
    assert 0 < io.inbox.waits[1] <= POLL_MS, (
        f"an idle scheduler should wait up to POLL_MS ({POLL_MS} ms) for a message, asked "
        f"{io.inbox.waits[1]} ms"
    )


def test_stats_queries_are_answered_and_not_passed_on(wired):
    io, outbox, worker_inbox = wired
    outbox.send([StatsQuery(uid=9), user(1)])
    got = io.receive(blocking=False)
    assert [type(m).__name__ for m in got] == ["UserMsg"], (
        f"the scheduler should get only the request, got {[type(m).__name__ for m in got]}"
    )
    replies = worker_inbox.drain(0)
    assert replies == [StatsReply(uid=9, stats={"slots_free": 3})], (
        f"expected the stats reply, got {replies}"
    )


def test_stats_queries_without_a_stats_source_get_an_empty_dict(ctx):
    to_scheduler, to_worker = addr("scheduler"), addr("worker")
    worker_inbox = Inbox(ctx, to_worker)
    io = ZmqSchedulerIO(ctx, to_scheduler, to_worker)  # stats=None: nothing to report
    Outbox(ctx, to_scheduler).send([StatsQuery(uid=4), user(1)])
    got = io.receive(blocking=False)
    assert [type(m).__name__ for m in got] == ["UserMsg"], (
        f"the scheduler should get only the request, got {[type(m).__name__ for m in got]}"
    )
    replies = worker_inbox.drain(0)
    assert replies == [StatsReply(uid=4, stats={})], (
        "without a stats source (stats=None) a query is still answered, the asker waits for its "
        f"reply, with empty stats ({{}}): got {replies}"
    )


def test_tokens_reach_the_worker_in_one_frame(wired, ctx):
    io, _, worker_inbox = wired
    io.send([DetokenizeMsg(1, 5, False), DetokenizeMsg(2, 6, True)])
    raw = worker_inbox.socket.recv(zmq.NOBLOCK)
    assert raw == encode_batch([DetokenizeMsg(1, 5, False), DetokenizeMsg(2, 6, True)]), (
        "a step's tokens should go out as one frame, in order"
    )


def test_a_scheduler_whose_server_died_exits(wired):
    io, _, _ = wired
    io.parent.parent = os.getppid() + 1  # as if the server that started this process were gone
    with refuses(SystemExit, "receive(blocking=True) with the server gone"):
        io.receive(blocking=True)


def test_a_busy_scheduler_whose_server_died_exits(wired):
    """A busy scheduler never blocks: if only an idle one checked on its server, one killed while
    requests decode would leave its scheduler decoding them for nobody."""
    io, outbox, _ = wired
    outbox.send([user(1)])
    io.parent.parent = os.getppid() + 1  # as if the server that started this process were gone
    try:
        io.receive(blocking=False)
    except SystemExit:
        return
    pytest.fail(
        "receive(blocking=False) returned although the server is gone: a scheduler with work "
        "must check on its parent too, at every call"
    )


def test_a_scheduler_whose_server_died_takes_no_message(wired):
    """The parent check comes before the inbox is drained: a scheduler whose server is gone
    neither waits for messages nobody will serve (an idle one would wait up to POLL_MS more) nor
    takes frames off its socket only to drop them."""
    io, _, _ = wired
    io.inbox = Recorder()
    io.parent.parent = os.getppid() + 1
    for blocking in (True, False):
        with pytest.raises(SystemExit):
            io.receive(blocking=blocking)
            pytest.fail(f"receive(blocking={blocking}) returned although the server is gone")
    assert io.inbox.waits == [], (
        "the server is gone, yet receive drained the inbox first (timeouts asked, in ms: "
        f"{io.inbox.waits}): check on the parent before taking any message"
    )


# ------------------------------------------------------------------------------------- watchdog


class FakeFrontend:
    def __init__(self, failure=None):
        self.failure, self.reasons = failure, []

    def fail(self, reason):
        self.reasons.append(reason)
        self.failure = self.failure or reason


def run_watch(procs, frontend, stopping, kill_after: int | None, code: int = -9):
    """Run the watchdog; after `kill_after` of its waits, the scheduler ends with exit code
    `code` (-9: killed)."""

    async def scenario():
        loop = procs[0].loop = LoopCheck()
        ticker = asyncio.ensure_future(loop.tick())
        try:
            return await watched()
        finally:
            ticker.cancel()

    async def watched():
        task = asyncio.ensure_future(launcher.watch(procs, frontend, stopping))
        for _ in range(kill_after if kill_after is not None else 5):
            await asyncio.sleep(launcher.WATCH_S)
        alive_then = not task.done() and not frontend.reasons
        if kill_after is not None:
            procs[0].exitcode = code
        try:
            await asyncio.wait_for(task, 10 * launcher.WATCH_S + 5)
        except asyncio.TimeoutError:
            task.cancel()
            return alive_then, False
        return alive_then, True

    return asyncio.run(scenario())


def procs():
    return [Proc("minisgl-scheduler"), Proc("minisgl-tokenizer")]


def test_a_dead_worker_fails_the_frontend_naming_it(capsys):
    frontend = FakeFrontend()
    alive_then, ended = run_watch(procs(), frontend, lambda: False, kill_after=3)
    assert alive_then, "while every worker lives, the watchdog must go on watching, failing nothing"
    assert ended and len(frontend.reasons) == 1, (
        f"a dead worker should fail the frontend once, got {frontend.reasons}"
    )
    reason = frontend.reasons[0]
    assert "minisgl-scheduler" in reason and "-9" in reason, (
        f"the reason should name the worker and its exit code, said {reason!r}"
    )
    said = capsys.readouterr().err
    assert "minisgl-scheduler" in said and "503" in said, (
        "the server's log (stderr) should say which worker died and that /health is 503, it "
        f"said {said!r}"
    )


def test_a_worker_that_exits_with_code_0_is_dead_too():
    # a scheduler whose loop returned: exit code 0 is no error, but its requests are gone all
    # the same; only `exitcode is None` means alive
    frontend = FakeFrontend()
    _, ended = run_watch(procs(), frontend, lambda: False, kill_after=3, code=0)
    assert ended and len(frontend.reasons) == 1, (
        "the scheduler exited with code 0 while the server was serving: the frontend should fail "
        f"once, naming it, got {frontend.reasons} (exitcode 0 is falsy: test `is not None`)"
    )
    reason = frontend.reasons[0]
    assert "minisgl-scheduler" in reason and " 0" in reason, (
        f"the reason should name the worker and its exit code 0, said {reason!r}"
    )


class SignalledFrontend(FakeFrontend):
    """The worker dies at the start of the watchdog's third look, and the signal that killed it
    reaches the server at that same moment: `stopping()` turns True as soon as the event loop runs
    anything else."""

    def __init__(self, procs):
        super().__init__()
        self.procs, self.looks, self.stopping = procs, 0, False

    @property
    def failure(self):
        self.looks += 1
        if self.looks == 3:
            self.procs[0].exitcode = -15
            asyncio.get_running_loop().call_soon(setattr, self, "stopping", True)
        return self._failure

    @failure.setter
    def failure(self, value):
        self._failure = value


def test_the_watchdog_waits_a_moment_before_calling_a_death_a_failure():
    workers = procs()
    frontend = SignalledFrontend(workers)

    async def scenario():
        loop = workers[0].loop = LoopCheck()
        ticker = asyncio.ensure_future(loop.tick())
        try:
            await asyncio.wait_for(
                launcher.watch(workers, frontend, lambda: frontend.stopping),
                20 * launcher.WATCH_S + 5,
            )
        finally:
            ticker.cancel()

    asyncio.run(scenario())
    assert not frontend.reasons, (
        "a worker ended by the same signal that stops the server is no failure: wait one look "
        "before deciding, giving the event loop back meanwhile (await asyncio.sleep(WATCH_S): "
        "a time.sleep holds the loop, so the server's own stop cannot be seen during it), "
        f"got {frontend.reasons}"
    )


def test_a_worker_ending_while_the_server_stops_is_not_a_failure():
    frontend = FakeFrontend()
    _, ended = run_watch(procs(), frontend, lambda: True, kill_after=1)
    assert ended and not frontend.reasons, (
        f"the server is stopping: its workers ending is no failure, got {frontend.reasons}"
    )


def test_the_watchdog_ends_when_the_frontend_has_failed_already():
    frontend = FakeFrontend(failure="the tokenizer died")
    _, ended = run_watch(procs(), frontend, lambda: False, kill_after=None)
    assert ended and not frontend.reasons, (
        "a frontend that failed already needs no watchdog: it should end, failing nothing more"
    )


def test_the_live_server_answers_with_this_code():
    """The real three-process server (`python -m minisgl serve`), with this chapter's code in
    every process, answers the official openai client as the offline engine does
    (live_server.py)."""
    from live_server import check_live_server

    check_live_server("chapter 14")
