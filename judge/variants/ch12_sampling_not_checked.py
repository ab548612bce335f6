"""`revive` that rebuilds SamplingParams without checking them (`object.__new__` and the fields).

A frame is input from another process. The offline LLM refuses a temperature of -1 at the door;
a revive that skips `SamplingParams.__post_init__` lets the same value through the socket, to
fail inside a batched sampler (on a GPU, in a kernel that asserts).
"""

import torch


def revive(obj):
    if "__tensor__" in obj:
        dtype = TENSOR_DTYPES.get(obj.get("dtype"))  # noqa: F821 (the module's)
        if dtype is None:
            raise ValueError(f"a tensor in a message has dtype {obj.get('dtype')!r}")
        return torch.tensor(obj["__tensor__"], dtype=dtype)
    if "__sampling__" in obj:
        params = object.__new__(SamplingParams)  # noqa: F821  the bug: no validation
        params.__dict__.update(SamplingParams().__dict__)  # noqa: F821
        params.__dict__.update(obj["__sampling__"])
        return params
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
