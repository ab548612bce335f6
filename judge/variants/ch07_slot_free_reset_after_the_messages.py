"""The normal loop that turns `_defer_slot_free` off after taking in the turn's messages.

Nothing is in flight between normal steps, so no freed slot needs keeping back; but an abort is a
message: taken in while the flag still says "defer" (as the last overlap step left it), its slot
goes on the deferred list, which only the overlap loop releases. The slot never comes back, and a
request waiting for one waits for ever.
"""


def normal_loop(self):
    for msg in self.receive_msg(blocking=not self.has_work):
        self._process_one_msg(msg)
    self._defer_slot_free = False  # the bug: too late for the aborts just taken in
    forward_input = self._schedule_next_batch()
    ongoing = None
    if forward_input is not None:
        self.engine.stream.wait_stream(self.stream)
        ongoing = (forward_input, self._forward(forward_input))
    self._process_last_data(ongoing)
