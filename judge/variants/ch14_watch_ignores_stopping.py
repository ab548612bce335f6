"""`watch` that reports every worker's death, even while the server stops.

Ctrl-C and `kill -TERM -PGID` reach every process of the group: the workers end at the same moment
as the server begins to stop. This watchdog then marks the server failed and prints that a worker
died, on every clean shutdown.
"""

import asyncio
import sys


async def watch(procs, frontend, stopping):
    while frontend.failure is None:
        dead = next((p for p in procs if p.exitcode is not None), None)
        if dead is not None:  # the bug: stopping() is never asked
            frontend.fail(f"{dead.name} exited with code {dead.exitcode}")
            print(
                f"minisgl: {dead.name} died (exit code {dead.exitcode}); /health is now 503",
                file=sys.stderr,
                flush=True,
            )
            return
        await asyncio.sleep(WATCH_S)  # noqa: F821 (the module's)
