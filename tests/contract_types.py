"""The dtype (and shape) a contract states for a returned tensor, checked in the contract's words.

A value test (`tolist() == [...]`) passes an int32 tensor where the contract says int64, yet the
engine's next user may index with it, `copy_` it into an int64 buffer, or hand it to a kernel that
reads 8 bytes a value. So every exercise whose contract names a dtype checks it, and says which
value it was: "order: expected int64 (the contract's dtype), got int32".
"""

from __future__ import annotations

from typing import Sequence

import torch


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def assert_dtype(value, want: torch.dtype, what: str, shape: Sequence[int] | None = None) -> None:
    """`value` is a tensor of dtype `want` (and of `shape`, if given); else one line naming
    `what`, the contract's dtype and shape, and what came instead."""
    assert isinstance(value, torch.Tensor), (
        f"{what}: expected a {dtype_name(want)} tensor, got {type(value).__name__}"
    )
    assert value.dtype == want, (
        f"{what}: expected {dtype_name(want)} (the contract's dtype), got {dtype_name(value.dtype)}"
    )
    if shape is not None:
        assert tuple(value.shape) == tuple(shape), (
            f"{what}: expected shape {list(shape)}, got {list(value.shape)}"
        )
