"""SwiGLU's activation, silu(gate) * up, as one Triton kernel (a GPU's; ops.silu_and_mul is the
reference). Batch 1 does it inside its gate|up projection instead (triton_norm_linear.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_launch import launch
from .triton_pdl import let_next_kernel_start, pdl_aware, wait_for_previous_kernel


@triton.jit
def silu_mul(g, u):
    """silu(g) * u rounded as ops.silu_and_mul rounds it, in float32: g is float32 holding values
    of the model's dtype, u is in that dtype; F.silu rounds to the dtype before the product."""
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype)
    return act.to(tl.float32) * u.to(tl.float32)


@pdl_aware
@triton.jit
def _silu_mul_kernel(X, Y, stride_x, stride_y, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    wait_for_previous_kernel()
    let_next_kernel_start()
    g = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(X + row * stride_x + n + cols, mask=ok, other=0.0)
    tl.store(Y + row * stride_y + cols, silu_mul(g, u).to(u.dtype), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * n)
    assert x2.stride(-1) == 1
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    block = 1024
    launch(
        _silu_mul_kernel,
        (x2.shape[0], triton.cdiv(n, block)),
        x2,
        y,
        x2.stride(0),
        y.stride(0),
        n,
        BLOCK=block,
        num_warps=4,
    )
    return y.view(*x.shape[:-1], n)
