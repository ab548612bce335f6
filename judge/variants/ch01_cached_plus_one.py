"""`complete_one` that advances `cached_len` by one token instead of to `device_len`.

Right for a decode step (one new token), wrong after a prefill: the whole prompt was just
processed, so everything the device knew is cached, not one token of it.
"""


def complete_one(self):
    self.cached_len += 1  # the bug: should be self.device_len
    self.device_len += 1
