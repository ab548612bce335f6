"""`time.sleep` called by the learner's code inside a running event loop, noticed in the test
process (plugin.py installs it before the swap, so `from time import sleep` gets it too).

A coroutine that sleeps with `time.sleep` blocks the whole loop: nothing else runs, no other
request is served. The tests then fail on what follows from it (a grace wait that took too long, a
client that was not answered), which does not say why; the judge puts the reason first.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import List, Set, Tuple

_real_sleep = time.sleep
_labels: Set[str] = set()  # the learner's snippets, by the file name their code carries
_seen: List[Tuple[str, int, float]] = []  # (function, line, seconds) in this test


def install(labels: Set[str]) -> None:
    _labels.update(labels)
    time.sleep = _sleep


def _sleep(seconds: float) -> None:
    frame = sys._getframe(1)
    if frame.f_code.co_filename in _labels:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # a plain function in a thread with no loop: sleeping is its own business
        else:
            _seen.append((frame.f_code.co_name, frame.f_lineno, seconds))
    return _real_sleep(seconds)


def reset() -> None:
    _seen.clear()


def note() -> str | None:
    """What to say first about a failed test in which the learner's code blocked the loop."""
    if not _seen:
        return None
    name, line, seconds = _seen[0]
    return (
        f"time.sleep({seconds:g}) in `{name}` (line {line}) runs inside the event loop: it blocks "
        "every other coroutine, so nothing else is served meanwhile; a coroutine waits with "
        "`await asyncio.sleep(...)`"
    )
