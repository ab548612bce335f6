"""`watch` that waits between its looks with `time.sleep`.

It finds the dead worker and reports it, but it runs on the API server's event loop, beside every
request: while it sleeps, nothing else on that loop runs. Every open stream stalls for WATCH_S at
each look, new connections wait, and the server's own stop (a signal handled on the loop) cannot be
seen during the grace wait, so a Ctrl-C is taken for a crash.
"""

import sys
import time


async def watch(procs, frontend, stopping):
    while frontend.failure is None:
        dead = next((p for p in procs if p.exitcode is not None), None)
        if dead is not None:
            time.sleep(WATCH_S)  # noqa: F821 (the module's)  the bug: holds the event loop
            if stopping():
                return
            frontend.fail(f"{dead.name} exited with code {dead.exitcode}")
            print(
                f"minisgl: {dead.name} died (exit code {dead.exitcode}); /health is now 503",
                file=sys.stderr,
                flush=True,
            )
            return
        time.sleep(WATCH_S)  # noqa: F821  the bug
