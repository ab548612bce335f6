"""`decode_batch` that turns every failure into its own "must be JSON" ValueError.

`except Exception` catches revive's refusal too: "unknown message type 'Shutdown'" arrives as
"a message frame must be JSON: unknown message type 'Shutdown'", blaming the encoding for a frame
that is perfectly good JSON, and SamplingParams' TypeError (a field this scheduler does not know)
becomes a ValueError. A refusal that already names its problem goes through unchanged.
"""

import json


def decode_batch(frame):
    try:
        items = json.loads(frame, object_hook=revive)  # noqa: F821 (the module's)
    except Exception as e:  # the bug: catches revive's and SamplingParams' errors as well
        raise ValueError(f"a message frame must be JSON: {e}") from None
    if not isinstance(items, list):
        raise ValueError(f"a message frame must be a JSON array, got {type(items).__name__}")
    bad = next((m for m in items if type(m).__name__ not in MESSAGE_TYPES), None)  # noqa: F821
    if bad is not None:
        raise ValueError(f"a message frame holds {bad!r}, which is not a message")
    return items
