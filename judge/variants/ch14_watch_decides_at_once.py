"""`watch` that asks `stopping()` the moment it sees a worker dead, without waiting.

It is right when a worker dies alone, and when the server began to stop well before. But Ctrl-C
and `kill -TERM -PGID` reach the workers and the server at the same moment: the worker is seen dead
before the server has handled its own signal, `stopping()` still says False, and a clean shutdown
is reported as a crash (a 503 and a "died" line in the log).
"""

import asyncio
import sys


async def watch(procs, frontend, stopping):
    while frontend.failure is None:
        dead = next((p for p in procs if p.exitcode is not None), None)
        if dead is not None:
            if stopping():  # the bug: no second look, one WATCH_S later
                return
            frontend.fail(f"{dead.name} exited with code {dead.exitcode}")
            print(
                f"minisgl: {dead.name} died (exit code {dead.exitcode}); /health is now 503",
                file=sys.stderr,
                flush=True,
            )
            return
        await asyncio.sleep(WATCH_S)  # noqa: F821 (the module's)
