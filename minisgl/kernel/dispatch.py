"""Which kernels the layers call: ops.py (plain torch, the reference, what the exercises replace)
and F.linear everywhere, or the Triton kernels of triton_ops.py for tensors on a GPU. Each engine
decides for itself (`Context.fused_kernels`, set from `EngineConfig.fused_kernels` or
MINISGL_FUSED_KERNELS, with the Triton attention backend only); a layer asks the context of the
engine running it, so two engines in one process may differ."""

from __future__ import annotations

from types import ModuleType

import torch

from minisgl.core import current_ctx

from . import ops


def fused_kernels(on: bool) -> ModuleType | None:
    """The fused-kernel module for an engine that wants it (`on`), else None."""
    if not on:
        return None
    from . import triton_ops  # imports triton: GPU machines only

    return triton_ops


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation with the running engine's kernels: the Triton one for a GPU tensor of
    an engine that uses them, ops.silu_and_mul otherwise."""
    fused = fused_for(x)
    return (fused if fused is not None else ops).silu_and_mul(x)


def fused_for(x: torch.Tensor) -> ModuleType | None:
    """The fused-kernel module if the running engine uses it and `x` lives on a GPU, else None."""
    if not x.is_cuda:
        return None
    ctx = current_ctx()
    return ctx.fused_kernels if ctx is not None else None
