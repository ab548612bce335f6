"""`revive` that wraps SamplingParams' refusals in its own ValueError.

SamplingParams already names the field and the value ("temperature must be >= 0, got -1"); the
wrapper adds nothing, and it turns the TypeError of a field this scheduler does not know (`min_p`
from a newer API server) into a ValueError, hiding what kind of mistake it was.
"""

import torch


def revive(obj):
    if "__tensor__" in obj:
        dtype = TENSOR_DTYPES.get(obj.get("dtype"))  # noqa: F821 (the module's)
        if dtype is None:
            raise ValueError(f"a tensor in a message has dtype {obj.get('dtype')!r}")
        return torch.tensor(obj["__tensor__"], dtype=dtype)
    if "__sampling__" in obj:
        try:
            return SamplingParams(**obj["__sampling__"])  # noqa: F821
        except (TypeError, ValueError) as e:  # the bug: SamplingParams' own error, rewritten
            raise ValueError(f"bad sampling parameters: {e}") from None
    if "__msg__" in obj:
        fields = {k: v for k, v in obj.items() if k != "__msg__"}
        name = obj["__msg__"]
        cls = MESSAGE_TYPES.get(name)  # noqa: F821
        if cls is None:
            raise ValueError(f"unknown message type {name!r}")
        try:
            return cls(**fields)
        except TypeError as e:
            raise ValueError(f"a {name} with the wrong fields: {e}") from None
    return obj
