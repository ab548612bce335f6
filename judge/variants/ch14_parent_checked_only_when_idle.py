"""`receive` that checks on the server only when the scheduler is idle.

An idle scheduler exits as it should once the server is gone. A busy one never does: while it has
requests decoding it asks with blocking False at every step, and a server killed with 32 requests
in flight leaves a scheduler decoding them for nobody, holding the GPU, until they finish (or,
under a steady load of aborted and retried requests, never).
"""

from minisgl.message import StatsQuery, StatsReply


def receive(self, blocking):
    if blocking:  # the bug: a busy scheduler never checks
        self.parent.check()
    msgs = self.inbox.drain(POLL_MS if blocking else 0)  # noqa: F821 (the module's)
    queries = [m for m in msgs if isinstance(m, StatsQuery)]
    if queries:
        stats = self.stats() if self.stats is not None else {}
        self.outbox.send([StatsReply(uid=q.uid, stats=stats) for q in queries])
    return [m for m in msgs if not isinstance(m, StatsQuery)]
