"""A socket that counts waits, for `Inbox.drain` in chapter 14's try-out and tests.

"Once a frame is there, drain does not wait again" is a rule about waits, and a real socket only
shows a wait as time passing: a drain that polls with its timeout before every frame returns the
right messages, one POLL_MS late. This socket holds frames that are already waiting and never
sleeps; instead it writes down every wait a real socket would have made, so a test can count them
instead of timing them.
"""

from __future__ import annotations

from typing import List

import zmq


class FrameSocket:
    """The part of a PULL socket that `Inbox.drain` uses (`poll`, `recv`), holding `frames`, all of
    them already waiting. `waits` lists each wait a real socket would have made: a poll with a
    timeout (in ms; None: forever) that found no frame."""

    def __init__(self, frames: List[bytes]) -> None:
        self.frames, self.waits = list(frames), []

    def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        if self.frames:
            return zmq.POLLIN  # a frame is there: a real poll returns at once, whatever the timeout
        if timeout != 0:  # 0 asks without waiting; None or a negative timeout waits forever
            self.waits.append(None if timeout is None or timeout < 0 else timeout)
        return 0

    def recv(self, flags: int = 0) -> bytes:
        if self.frames:
            return self.frames.pop(0)
        if not flags & zmq.NOBLOCK:
            raise AssertionError(
                "recv() without zmq.NOBLOCK on a socket with no frame left waits forever: take the "
                "frames with recv(zmq.NOBLOCK), which raises zmq.Again when none is left"
            )
        raise zmq.Again()
