"""`encode_value` that encodes a message's fields from `dataclasses.asdict(message)`.

The docstring's "Uses:" line names asdict, and it looks like the shortcut: but asdict recurses into
every dataclass inside, so the SamplingParams a UserMsg holds arrives as a plain dict of its fields,
without the tag that says what it was; revive leaves it a dict, and the scheduler gets a request
whose sampling parameters are a dict.
"""

import dataclasses

import torch

from minisgl.core import SamplingParams
from minisgl.message.wire import MESSAGE_TYPES, TENSOR_DTYPES


def encode_value(value):
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in TENSOR_DTYPES or value.dim() != 1:
            raise TypeError(
                f"only 1-D int32/int64 tensors travel in messages, got {value.dim()}-D {dtype}"
            )
        return {"__tensor__": value.tolist(), "dtype": dtype}
    if isinstance(value, SamplingParams):
        return {"__sampling__": dataclasses.asdict(value)}
    if dataclasses.is_dataclass(value):
        name = type(value).__name__
        if name not in MESSAGE_TYPES:
            raise TypeError(f"{name} is not a message type")
        fields = {k: encode_value(v) for k, v in dataclasses.asdict(value).items()}
        return {"__msg__": name, **fields}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: encode_value(v) for k, v in value.items()}
    return value
