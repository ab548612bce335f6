"""Does a coroutine give the event loop back while it waits? For the watchdog of chapter 14, in its
try-out and its tests: a `time.sleep` in a coroutine shows only later, as timing faults (a grace
wait that cannot see the server stop, a run that never ends); this says it at the look after."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from minisgl.server.launcher import WATCH_S


class LoopCheck:
    """Notices a watchdog that waits without giving the event loop back. A ticker on the loop counts
    while the watchdog waits between looks; two looks half a WATCH_S or more apart with no tick
    between them mean the wait held the loop (time.sleep), and every request the server serves on
    that loop with it. Said at once, as the failure, instead of as the timing faults it causes
    later (a grace wait that cannot see the server stop, a test that never ends)."""

    def __init__(self):
        self.ticks, self.last = 0, None

    async def tick(self):
        while True:
            await asyncio.sleep(WATCH_S / 5)
            self.ticks += 1

    def look(self):
        now = (self.ticks, time.monotonic())
        if self.last is not None and now[0] == self.last[0]:
            apart = now[1] - self.last[1]
            if apart >= WATCH_S / 2:
                raise AssertionError(
                    f"the watchdog's looks came {apart:.2f} s apart and nothing else on the event "
                    "loop ran in between: it waits with a blocking call (time.sleep?), which "
                    "stops every request of the server meanwhile. A coroutine waits with `await "
                    "asyncio.sleep(WATCH_S)`"
                )
        self.last = now


class Proc:
    """A worker as the watchdog sees it: a name and an exit code (None while it lives). Each read of
    the first worker's exit code is a look, checked by `loop` when given; `on_seen_dead`, when set,
    is called once, at the first look that finds the worker dead."""

    def __init__(self, name, loop: LoopCheck | None = None):
        self.name, self._exitcode, self.loop = name, None, loop
        self.on_seen_dead: Callable[[], None] | None = None

    @property
    def exitcode(self):
        if self.loop is not None:
            self.loop.look()
        if self._exitcode is not None and self.on_seen_dead is not None:
            seen, self.on_seen_dead = self.on_seen_dead, None
            seen()
        return self._exitcode

    @exitcode.setter
    def exitcode(self, value):
        self._exitcode = value


class ServerStop:
    """`stopping()` of a server stopped by the signal that also ended a worker (Ctrl-C, `kill -TERM
    -PGID`): both happen at once, but the server handles its own signal only when its event loop
    next runs something else. Hand `signal` to the worker's `Proc.on_seen_dead`: asked at the look
    that sees the death, `stopping()` still says False; after a wait that gave the loop back, True.
    A watchdog that decides without that second look, or waits holding the loop, takes a clean stop
    for a crash."""

    def __init__(self) -> None:
        self.begun = False

    def __call__(self) -> bool:
        return self.begun

    def signal(self) -> None:
        asyncio.get_running_loop().call_soon(setattr, self, "begun", True)
