"""`encode_value` that sends a tensor's ids without its dtype, and `revive` that takes torch's
default.

The ids arrive, but as int64: the scheduler's token pool is int32, and a prompt's dtype decides the
dtype of every tensor built from it. Sending the dtype costs a few bytes; guessing it costs a bug
that shows up chapters away from the wire.
"""

import dataclasses

import torch


def encode_value(value):
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in TENSOR_DTYPES or value.dim() != 1:  # noqa: F821 (the module's)
            raise TypeError(
                f"only 1-D int32/int64 tensors travel in messages, got {value.dim()}-D {dtype}"
            )
        return {"__tensor__": value.tolist()}  # the bug: no dtype
    if isinstance(value, SamplingParams):  # noqa: F821
        return {"__sampling__": dataclasses.asdict(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if name not in MESSAGE_TYPES:  # noqa: F821
            raise TypeError(f"{name} is not a message type")
        return {
            "__msg__": name,
            **{f.name: encode_value(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: encode_value(v) for k, v in value.items()}
    return value


def revive(obj):
    if "__tensor__" in obj:
        return torch.tensor(obj["__tensor__"])  # the bug: torch's default dtype, int64
    if "__sampling__" in obj:
        return SamplingParams(**obj["__sampling__"])  # noqa: F821
    if "__msg__" in obj:
        name = obj.pop("__msg__")
        cls = MESSAGE_TYPES.get(name)  # noqa: F821
        if cls is None:
            raise ValueError(f"unknown message type {name!r}")
        try:
            return cls(**obj)
        except TypeError as e:
            raise ValueError(f"a {name} with the wrong fields: {e}") from None
    return obj
