"""`watch` that takes a worker for dead only when its exit code is true: `if p.exitcode:`.

A killed worker (-9) or one that failed (1) is seen; a scheduler whose loop returned exits with 0,
which is falsy, and the watchdog keeps saying all is well while its clients wait forever. Alive
is `exitcode is None`, nothing else.
"""

import asyncio
import sys


async def watch(procs, frontend, stopping):
    while frontend.failure is None:
        dead = next((p for p in procs if p.exitcode), None)  # the bug: exit code 0 is missed
        if dead is not None:
            await asyncio.sleep(WATCH_S)  # noqa: F821 (the module's)
            if stopping():
                return
            frontend.fail(f"{dead.name} exited with code {dead.exitcode}")
            print(
                f"minisgl: {dead.name} died (exit code {dead.exitcode}); /health is now 503",
                file=sys.stderr,
                flush=True,
            )
            return
        await asyncio.sleep(WATCH_S)  # noqa: F821
