"""`encode_value` that refuses only floating-point tensors.

The rule is the other way round: only int32 and int64 travel. An int16, uint8 or bool tensor is
sent, and the receiver's revive refuses its dtype: the failure moves from the sender, where the
bug is, to another process.
"""

import dataclasses

import torch


def encode_value(value):
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if value.is_floating_point() or value.dim() != 1:  # the bug: int16, uint8, bool pass
            raise TypeError(
                f"only 1-D int32/int64 tensors travel in messages, got {value.dim()}-D {dtype}"
            )
        return {"__tensor__": value.tolist(), "dtype": dtype}
    if isinstance(value, SamplingParams):  # noqa: F821 (the module's)
        return {"__sampling__": dataclasses.asdict(value)}
    if dataclasses.is_dataclass(value):
        name = type(value).__name__
        if name not in MESSAGE_TYPES:  # noqa: F821
            raise TypeError(f"{name} is not a message type")
        fields = {f.name: encode_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__msg__": name, **fields}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: encode_value(v) for k, v in value.items()}
    return value
