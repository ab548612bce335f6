"""`receive` that checks on the server after taking the messages.

It exits all the same, but only after it has waited for messages nobody will serve (an idle
scheduler: up to POLL_MS more) and taken frames off its socket only to drop them.
"""

from minisgl.message import StatsQuery, StatsReply


def receive(self, blocking):
    msgs = self.inbox.drain(POLL_MS if blocking else 0)  # noqa: F821 (the module's)
    self.parent.check()  # the bug: after the messages are taken
    queries = [m for m in msgs if isinstance(m, StatsQuery)]
    if queries:
        stats = self.stats() if self.stats is not None else {}
        self.outbox.send([StatsReply(uid=q.uid, stats=stats) for q in queries])
    return [m for m in msgs if not isinstance(m, StatsQuery)]
