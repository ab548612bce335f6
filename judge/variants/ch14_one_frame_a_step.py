"""`drain` that takes one frame per call.

Nothing is lost: the next call takes the next frame. But the scheduler calls once a step, so under
load its inbox grows a step behind for every extra frame: 32 requests that arrive together join the
running batch one step apart, and each waits for the ones before it.
"""

import zmq


def drain(self, timeout_ms):
    if not self.socket.poll(timeout_ms):
        return []
    return decode_batch(self.socket.recv(zmq.NOBLOCK))  # noqa: F821 (the module's)  the bug: one frame only
