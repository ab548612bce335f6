"""The normal loop that leaves `_defer_slot_free` as the last overlap step set it.

After a switch from the overlap loop, a slot freed in the normal loop is still kept back for one
more step, as if a step were in flight: a request that could take it waits a step for nothing.
"""


def normal_loop(self):
    # the bug: no `self._defer_slot_free = False`: nothing is in flight between normal steps
    for msg in self.receive_msg(blocking=not self.has_work):
        self._process_one_msg(msg)
    forward_input = self._schedule_next_batch()
    ongoing = None
    if forward_input is not None:
        self.engine.stream.wait_stream(self.stream)
        ongoing = (forward_input, self._forward(forward_input))
    self._process_last_data(ongoing)
