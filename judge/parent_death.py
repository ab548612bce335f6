"""A test process dies with its parent (Linux's PR_SET_PDEATHSIG).

The learner's code runs in the test process, and can kill its parent: the judge's fork server,
which reports the process's exit status, or the judge itself. Without this the test process would
go on, finish the test that did it as passing, and perhaps every other test before the judge
noticed; with it, the kernel kills the test process at once, inside that test, whose result is
then a crash (event_replay.py). Elsewhere (macOS, Windows) nothing is done: event_replay.py's rule
that only a process that ended as pytest ends gives evidence still holds there."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int | None = None) -> bool:
    """Ask the kernel to SIGKILL this process when its parent ends. `parent`: the pid it must
    still have (after a fork the parent may already be gone, and the request would never fire):
    if it has changed, this process ends now. Returns whether the request was made."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True
