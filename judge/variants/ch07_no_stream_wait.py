"""The normal loop launches each step without making the engine stream wait for the scheduler
stream.

On a CPU with eager streams nothing shows. On a GPU (and with deferred CPU streams) the index
tensors and prompt tokens copied on the scheduler stream may not have arrived when the engine
reads them, and the step computes garbage.
"""


def normal_loop(self):
    self._defer_slot_free = False
    for msg in self.receive_msg(blocking=not self.has_work):
        self._process_one_msg(msg)
    forward_input = self._schedule_next_batch()
    ongoing = None
    if forward_input is not None:
        ongoing = (forward_input, self._forward(forward_input))
    self._process_last_data(ongoing)
