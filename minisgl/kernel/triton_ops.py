"""Fused Triton versions of the element-wise ops in ops.py (GPU only; `triton` is imported here).

A decode step of a small batch is limited by how many kernels it launches, not by arithmetic: the
plain-torch RMSNorm is eight kernels (cast, square, mean, add, rsqrt, multiply, cast, weight), RoPE
of q and k fourteen. Each function here is one kernel doing the same arithmetic in the same order
of roundings (float32 inside, the model's dtype where torch would round), so float32 results agree
with ops.py to the last bits and bfloat16 ones within a rounding.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(X, R, W, Y, R_OUT, stride_x, stride_r, stride_y, stride_ro, n, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:  # residual = x + residual, rounded to the dtype as torch's add does
        r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(R_OUT + row * stride_ro + cols, x, mask=ok)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n
    y = (xf * tl.rsqrt(var + eps)).to(X.dtype.element_ty)
    w = tl.load(W + cols, mask=ok, other=0.0)
    tl.store(Y + row * stride_y + cols, (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _add_rms_norm(x, None, weight, eps)[0]


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    return _add_rms_norm(x, residual, weight, eps)


def _add_rms_norm(x, residual, weight, eps):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    assert x2.stride(-1) == 1
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if residual is not None:
        r2 = residual.reshape(-1, n)
        r_out = torch.empty_like(y)
    else:
        r2 = r_out = x2  # unused
    _add_rms_norm_kernel[(x2.shape[0],)](
        x2, r2, weight, y, r_out, x2.stride(0), r2.stride(0), y.stride(0), r_out.stride(0), n, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n), num_warps=4)
    if residual is None:
        return y.view(x.shape), x
    return y.view(x.shape), r_out.view(x.shape)


@triton.jit
def _norm_rope_kernel(X, W, COS, SIN, POS, stride_t, stride_h, stride_cos, eps,
                      HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """In place, one (token, head): optional RMSNorm over the head, then NeoX RoPE."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    ptr = X + t * stride_t + h * stride_h
    x1 = tl.load(ptr + i)
    x2 = tl.load(ptr + HALF + i)
    dt = x1.dtype
    if HAS_NORM:
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        r = tl.rsqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / (2 * HALF) + eps)
        w1 = tl.load(W + i).to(tl.float32)
        w2 = tl.load(W + HALF + i).to(tl.float32)
        x1 = (w1 * (f1 * r).to(dt).to(tl.float32)).to(dt)
        x2 = (w2 * (f2 * r).to(dt).to(tl.float32)).to(dt)
    pos = tl.load(POS + t)
    c = tl.load(COS + pos * stride_cos + i).to(dt).to(tl.float32)  # ops.py casts the table to the dtype
    s = tl.load(SIN + pos * stride_cos + i).to(dt).to(tl.float32)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    tl.store(ptr + i, (a * c - b * s).to(dt))
    tl.store(ptr + HALF + i, (b * c + a * s).to(dt))


def norm_rope_(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [tokens, heads, head_dim], any token/head strides, last dim contiguous; changed in place.
    cos, sin: [max_position, head_dim // 2] tables (float32); positions: [tokens]."""
    tokens, heads, head_dim = x.shape
    half = head_dim // 2
    assert x.stride(-1) == 1 and half == triton.next_power_of_2(half)
    assert cos.stride(-1) == 1 and cos.stride() == sin.stride()
    if tokens:
        _norm_rope_kernel[(tokens, heads)](
            x, weight if weight is not None else x, cos, sin, positions, x.stride(0), x.stride(1),
            cos.stride(0), eps, HALF=half, HAS_NORM=weight is not None, num_warps=1)
    return x


@triton.jit
def _silu_mul_kernel(X, Y, stride_x, stride_y, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    g = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(X + row * stride_x + n + cols, mask=ok, other=0.0)
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype)  # F.silu rounds to the dtype before the product
    tl.store(Y + row * stride_y + cols, (act.to(tl.float32) * u.to(tl.float32)).to(u.dtype), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * n)
    assert x2.stride(-1) == 1
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    block = 1024
    if x2.shape[0]:
        _silu_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, y, x2.stride(0), y.stride(0), n,
                                                               BLOCK=block, num_warps=4)
    return y.view(*x.shape[:-1], n)
