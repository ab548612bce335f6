"""Which kernels the layers call: ops.py (plain torch, the reference, what the exercises replace) and
F.linear everywhere, or the Triton kernels of triton_ops.py for tensors on a GPU, once an engine
turns them on (it does with the Triton attention backend unless `fused_kernels=False` or
MINISGL_FUSED_KERNELS=0)."""

from __future__ import annotations

import os
from types import ModuleType

import torch

_fused: ModuleType | None = None


def use_fused_kernels(on: bool) -> None:
    global _fused
    if on and os.environ.get("MINISGL_FUSED_KERNELS", "1") != "0":
        from . import triton_ops  # imports triton: GPU machines only

        _fused = triton_ops
    else:
        _fused = None


def fused_for(x: torch.Tensor) -> ModuleType | None:
    """The fused-kernel module if it is on and `x` lives on a GPU, else None."""
    return _fused if _fused is not None and x.is_cuda else None
