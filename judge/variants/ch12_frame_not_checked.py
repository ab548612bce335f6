"""`decode_batch` that trusts the frame: whatever json.loads returns is handed on.

A frame holding one object instead of an array, or an array with a number in it, reaches the
scheduler, which fails on it with an AttributeError in the middle of its loop, naming nothing.
"""

import json


def decode_batch(frame):
    return json.loads(frame, object_hook=revive)  # noqa: F821 (the module's)
