"""`receive` that answers a StatsQuery with `self.stats()`, also when there is no stats source.

With a stats source it is right. An I/O made without one (`stats=None`: the server's scheduler
process sets its source only once the scheduler is built; the chapter's own scheduler cell never
does) raises TypeError at the first query, inside the scheduler's step: the scheduler dies, every
request in flight with it, and the asker waits its 10 s for a reply that never comes.
"""

from minisgl.message import StatsQuery, StatsReply


def receive(self, blocking):
    self.parent.check()
    msgs = self.inbox.drain(POLL_MS if blocking else 0)  # noqa: F821 (the module's)
    queries = [m for m in msgs if isinstance(m, StatsQuery)]
    if queries:  # the bug: self.stats may be None
        self.outbox.send([StatsReply(uid=q.uid, stats=self.stats()) for q in queries])
    return [m for m in msgs if not isinstance(m, StatsQuery)]
