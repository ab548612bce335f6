"""A decode step of batch 1 runs, twice a layer, a residual add + RMSNorm whose only reader is the
next projection (q|k|v, then gate|up). Here the two are one kernel: every program normalizes the
one row itself (1024 values, read from L2) and multiplies it by its rows of W, so the norm costs
no launch and no round trip through memory; with `gated` the SiLU·mul of the MLP is done on the
products too. Every rounding is where the separate kernels round (triton_ops.py), so the tokens
are those of the unfused path.

One row only, and a hidden size whose row fits one block: `fits` says when; otherwise the layers
run the separate kernels.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from .triton_launch import launch
from .triton_pdl import let_next_kernel_start, pdl_aware, wait_for_previous_kernel
from .triton_silu import silu_mul

_TILE = 16384  # weights a program holds in registers: BLOCK_N x BLOCK_K (x 2 gated)
_MAX_HIDDEN = 4096


@pdl_aware
@triton.jit
def _norm_linear_kernel(
    X,
    R,
    NW,
    W,
    Y,
    R_OUT,
    N,
    K,
    stride_w,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Outputs p * BLOCK_N .. + BLOCK_N of one row: h = rms_norm(x + r) * nw, then h W^T, or
    silu(h Wg^T) * (h Wu^T) with GATED, the up rows N rows after the gate's. Program 0
    also writes x + r to R_OUT. The weights are read before the previous kernel ends (PDL)."""
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    k_ok = k < K
    w_ok = n_ok[:, None] & k_ok[None, :]
    rows = W + n[:, None].to(tl.int64) * stride_w + k[None, :]
    wg = tl.load(rows, mask=w_ok, other=0.0)
    if GATED:
        wu = tl.load(rows + N * stride_w, mask=w_ok, other=0.0)
    nw = tl.load(NW + k, mask=k_ok, other=0.0)
    wait_for_previous_kernel()
    let_next_kernel_start()

    x = tl.load(X + k, mask=k_ok, other=0.0)
    if HAS_RESIDUAL:  # rounded to the dtype as torch's add does
        r = tl.load(R + k, mask=k_ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        if pid == 0:
            tl.store(R_OUT + k, x, mask=k_ok)
    xf = x.to(tl.float32)
    h = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / K + eps)).to(X.dtype.element_ty)
    h = (nw.to(tl.float32) * h.to(tl.float32)).to(X.dtype.element_ty).to(tl.float32)

    out = tl.sum(h[None, :] * wg.to(tl.float32), axis=1)
    if GATED:  # each product rounded to the dtype, as the unfused path stores them
        g = out.to(Y.dtype.element_ty).to(tl.float32)
        u = tl.sum(h[None, :] * wu.to(tl.float32), axis=1).to(Y.dtype.element_ty)
        out = silu_mul(g, u)
    tl.store(Y + n, out.to(Y.dtype.element_ty), mask=n_ok)


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One row whose hidden size one block holds, and a contiguous weight."""
    return (
        x.numel() == x.shape[-1] <= _MAX_HIDDEN
        and weight.is_contiguous()
        and weight.shape[1] == x.shape[-1]
    )


def norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    gated: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, x + residual) for one row x: y = rms_norm(x + residual) @ weight.T, or with `gated`
    (weight = [gate | up] rows) silu(gate part) * up part. Without a residual, x is normalized and
    returned as the residual (the first layer)."""
    assert fits(x, weight)
    k_dim = x.shape[-1]
    rows = weight.shape[0]
    n = rows // 2 if gated else rows
    block_k = triton.next_power_of_2(k_dim)
    block_n = max(1, _TILE // block_k // (2 if gated else 1))
    y = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    r_out = torch.empty_like(x) if residual is not None else x
    launch(
        _norm_linear_kernel,
        (triton.cdiv(n, block_n),),
        x,
        residual if residual is not None else x,
        norm_weight,
        weight,
        y,
        r_out,
        n,
        k_dim,
        weight.stride(0),
        eps,
        HAS_RESIDUAL=residual is not None,
        GATED=gated,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
    )
    return y, r_out
