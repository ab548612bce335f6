"""`overlap_loop` that releases the parked slots only at the start of a turn with nothing in
flight, never at the end of a turn that launched nothing.

Such a turn has just handled the last batch in flight, and the requests that ended in it parked
their slots. With nothing left to launch the engine goes idle, and the turn that would release
them at its start may never come: an offline `generate` returns with slots missing, and a server
with one slot and a queued request... has no queued request it can run, since the queue waits for
the slot. Nothing in flight is the moment to give them back.
"""


def overlap_loop(self, last_data):
    self._defer_slot_free = True
    if last_data is None:
        self._release_deferred_slots()
    blocking = not (last_data is not None or self.has_work)
    for msg in self.receive_msg(blocking=blocking):
        self._process_one_msg(msg)
    forward_input = self._schedule_next_batch()
    ongoing = None
    if forward_input is not None:
        self.engine.stream.wait_stream(self.stream)
        ongoing = (forward_input, self._forward(forward_input))
    self._process_last_data(last_data)
    return ongoing  # the bug: nothing in flight now, and the slots just parked stay parked
