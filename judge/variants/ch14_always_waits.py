"""`receive` that always waits POLL_MS for messages, busy or not.

The results are right, but every step of a busy scheduler now waits 200 ms for messages that may
never come, while the device idles: a decode step of a few milliseconds becomes 200.
"""

from minisgl.message import StatsQuery, StatsReply


def receive(self, blocking):
    self.parent.check()
    msgs = self.inbox.drain(POLL_MS)  # noqa: F821 (the module's)  the bug: waits even with work to do
    queries = [m for m in msgs if isinstance(m, StatsQuery)]
    if queries:
        stats = self.stats() if self.stats is not None else {}
        self.outbox.send([StatsReply(uid=q.uid, stats=stats) for q in queries])
    return [m for m in msgs if not isinstance(m, StatsQuery)]
