"""Triton kernels for the layers on a GPU (`triton` is imported here; nothing on a CPU imports it).

A decode step of a small batch is limited by how many kernels it launches, not by arithmetic: the
plain-torch RMSNorm is eight kernels (cast, square, mean, add, rsqrt, multiply, cast, weight), RoPE
of q and k fourteen. The element-wise functions here are one kernel each, doing the arithmetic of
ops.py in the same order of roundings (float32 inside, the model's dtype where torch would round),
so float32 results agree with ops.py to the last bits and bfloat16 ones within a rounding. Two
more: the attention layer's q/k norm + RoPE + K/V store in one kernel, and a matrix-vector product
for one-row batches, where cuBLAS is slow for some shapes; and, from triton_norm_linear.py, batch
1's add + RMSNorm fused into the projection after it.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from .triton_launch import launch, settings
from .triton_norm_linear import fits as norm_linear_fits
from .triton_norm_linear import norm_linear
from .triton_pdl import let_next_kernel_start, pdl_aware, wait_for_previous_kernel
from .triton_silu import silu_and_mul

__all__ = [
    "fused_add_rms_norm",
    "norm_linear",
    "norm_linear_fits",
    "qk_norm_rope_store_",
    "rms_norm",
    "silu_and_mul",
    "small_batch_linear",
]


@pdl_aware
@triton.jit
def _add_rms_norm_kernel(
    X,
    R,
    W,
    Y,
    R_OUT,
    stride_x,
    stride_r,
    stride_y,
    stride_ro,
    n,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One row of the residual add and RMSNorm, in one pass over memory.

    What ops.fused_add_rms_norm (or ops.rms_norm, without a residual) computes, for the row of
    this program: one launch where torch runs eight or nine kernels.

    Receives: X, R (the residual) and Y, R_OUT (the outputs): [rows, n] each, row `r` starting at
        `r * stride_*`, its n values contiguous; W: the weight, [n]; eps; HAS_RESIDUAL (without
        it R and R_OUT are not touched); BLOCK: a power of two >= n, so one block holds the row.
        Launched with one program per row (`rms_norm`, `fused_add_rms_norm`).
    Returns: nothing; writes R_OUT = X + R rounded to X's dtype (with a residual), and Y = W *
        rms_norm(that sum, or X), rounded as ops.rms_norm rounds: the mean of squares over the n
        values (never the block's padding) and the root in float32, eps inside the root, the
        normalized row cast to X's dtype before the weight, the product cast to Y's.
    Leaves: X, R and W as they were.
    Uses: `tl.program_id`, `tl.arange`, `tl.load` / `tl.store` with a mask, `tl.sum`, `tl.rsqrt`.
    Checked: against ops.rms_norm and ops.fused_add_rms_norm, float32 and bfloat16, hidden sizes
        that are not a power of two, one row and several, rows of a strided view, a large eps.
    """
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    w = tl.load(W + cols, mask=ok, other=0.0)  # a weight: read before the previous kernel ends
    wait_for_previous_kernel()
    let_next_kernel_start()
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:  # residual = x + residual, rounded to the dtype as torch's add does
        r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(R_OUT + row * stride_ro + cols, x, mask=ok)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n
    y = (xf * tl.rsqrt(var + eps)).to(X.dtype.element_ty)
    tl.store(
        Y + row * stride_y + cols,
        (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty),
        mask=ok,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _add_rms_norm(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
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
    launch(
        _add_rms_norm_kernel,
        (x2.shape[0],),
        x2,
        r2,
        weight,
        y,
        r_out,
        x2.stride(0),
        r2.stride(0),
        y.stride(0),
        r_out.stride(0),
        n,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(n),
        num_warps=4,
    )
    if residual is None:
        return y.view(x.shape), x
    return y.view(x.shape), r_out.view(x.shape)


@triton.jit
def _norm_rope(x1, x2, W, c, s, i, eps, HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """One head, as its two halves: optional RMSNorm over the head, then NeoX RoPE by (c, s)."""
    dt = x1.dtype
    if HAS_NORM:
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        r = tl.rsqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / (2 * HALF) + eps)
        w1 = tl.load(W + i).to(tl.float32)
        w2 = tl.load(W + HALF + i).to(tl.float32)
        x1 = (w1 * (f1 * r).to(dt).to(tl.float32)).to(dt)
        x2 = (w2 * (f2 * r).to(dt).to(tl.float32)).to(dt)
    c = c.to(dt).to(tl.float32)  # ops.py casts the table to the dtype
    s = s.to(dt).to(tl.float32)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    return (a * c - b * s).to(dt), (b * c + a * s).to(dt)


@pdl_aware
@triton.jit
def _qk_norm_rope_store_kernel(
    QKV,
    QW,
    KW,
    COS,
    SIN,
    POS,
    LOC,
    KC,
    VC,
    stride_t,
    stride_cos,
    stride_kc,
    stride_vc,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """One (token, head) of the merged q|k|v output. A query head is normalized and rotated in
    place; a key head is normalized, rotated and written to the cache at the token's location,
    its value head beside it."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    pos = tl.load(POS + t)
    c = tl.load(COS + pos * stride_cos + i)
    s = tl.load(SIN + pos * stride_cos + i)
    wait_for_previous_kernel()  # the positions and tables are step inputs; qkv is not
    let_next_kernel_start()
    row = QKV + t.to(tl.int64) * stride_t
    if h < NUM_HEADS:
        ptr = row + h * (2 * HALF)
        y1, y2 = _norm_rope(
            tl.load(ptr + i), tl.load(ptr + HALF + i), QW, c, s, i, eps, HALF, HAS_NORM
        )
        tl.store(ptr + i, y1)
        tl.store(ptr + HALF + i, y2)
    else:
        j = h - NUM_HEADS
        loc = tl.load(LOC + t).to(tl.int64)
        kp = row + (NUM_HEADS + j) * (2 * HALF)
        y1, y2 = _norm_rope(
            tl.load(kp + i), tl.load(kp + HALF + i), KW, c, s, i, eps, HALF, HAS_NORM
        )
        kc = KC + loc * stride_kc + j * (2 * HALF)
        tl.store(kc + i, y1)
        tl.store(kc + HALF + i, y2)
        vp = row + (NUM_HEADS + NUM_KV_HEADS + j) * (2 * HALF)
        vc = VC + loc * stride_vc + j * (2 * HALF)
        tl.store(vc + i, tl.load(vp + i))
        tl.store(vc + HALF + i, tl.load(vp + HALF + i))


def qk_norm_rope_store_(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_loc: torch.Tensor,
) -> None:
    """What the attention layer does between its projection and attention, in one kernel: per-head
    RMSNorm of q and k (Qwen3; skipped when the weights are None), RoPE at `positions`, and the
    store of this step's keys and values at `out_loc` — the work of ops.rms_norm,
    ops.apply_rope_neox and KVCache.store_kv, without the keys and values making a round trip
    through memory.

    qkv: [tokens, (num_heads + 2 * num_kv_heads) * head_dim], last dim contiguous: the queries are
    rotated in place (the keys there are left as they were). k_cache, v_cache: [locations,
    num_kv_heads, head_dim]. cos, sin: [max_position, head_dim // 2] float32 tables."""
    tokens = qkv.shape[0]
    head_dim = k_cache.shape[-1]
    half = head_dim // 2
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and qkv.stride(1) == 1
    assert half == triton.next_power_of_2(half)
    for cache in (k_cache, v_cache):
        assert cache.shape[1:] == (num_kv_heads, head_dim) and cache.stride()[1:] == (head_dim, 1)
    assert cos.stride(-1) == 1 and cos.stride() == sin.stride()
    assert (q_weight is None) == (k_weight is None)
    norm = q_weight is not None
    launch(
        _qk_norm_rope_store_kernel,
        (tokens, num_heads + num_kv_heads),
        qkv,
        q_weight if norm else qkv,
        k_weight if norm else qkv,
        cos,
        sin,
        positions,
        out_loc,
        k_cache,
        v_cache,
        qkv.stride(0),
        cos.stride(0),
        k_cache.stride(0),
        v_cache.stride(0),
        eps,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF=half,
        HAS_NORM=norm,
        num_warps=1,
    )


@pdl_aware
@triton.jit
def _small_batch_linear_kernel(
    X,
    W,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Y = X W^T for BLOCK_N rows of W against every row of X, summed in float32 over K.

    Program p computes the outputs p * BLOCK_N .. p * BLOCK_N + BLOCK_N - 1. Each program asks
    for a large slice of W at once, which is what keeps enough bytes in flight to stream the
    weights at the memory's speed.

    Receives: X [M, K] (row m at m * stride_xm), W [N, K] (row n at n * stride_wn), Y [M, N] (row
        m at m * stride_ym), all contiguous along their last dimension; BLOCK_M: a power of two
        >= M (every row of X in one program); BLOCK_N rows of W per program; BLOCK_K: the slice
        of K read at a time (K need not be a multiple of it). Launched with cdiv(N, BLOCK_N)
        programs (`small_batch_linear`).
    Returns: nothing; writes Y[m, n] = sum over k of X[m, k] * W[n, k], accumulated in float32
        and rounded once to Y's dtype, for the m < M and n < N of this program; nothing outside
        Y's M x N.
    Leaves: X and W as they were.
    Uses: `tl.program_id`, `tl.arange`, `tl.zeros`, a loop over K's slices, masked `tl.load`
        (other=0.0), broadcasting (`[:, None, :]`), `tl.sum` over an axis, masked `tl.store`.
    Checked: against x @ W^T in float64, float32 and bfloat16, N and K that are not multiples of
        the blocks, one row and several, rows of x at a stride.
    """
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    # the first slice of W is asked for before the previous kernel has finished (that kernel
    # writes x, never W): under PDL the weights stream while the kernel before this one runs
    k = tl.arange(0, BLOCK_K)
    k_ok = k < K
    w = tl.load(
        W + n[:, None].to(tl.int64) * stride_wn + k[None, :],
        mask=n_ok[:, None] & k_ok[None, :],
        other=0.0,
    )
    wait_for_previous_kernel()
    let_next_kernel_start()
    x = tl.load(
        X + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0
    )
    acc = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    for k0 in range(BLOCK_K, K, BLOCK_K):  # the other slices
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(
            W + n[:, None].to(tl.int64) * stride_wn + k[None, :],
            mask=n_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        x = tl.load(
            X + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0
        )
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    tl.store(
        Y + m[:, None] * stride_ym + n[None, :],
        acc.to(Y.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )


def small_batch_linear(
    x: torch.Tensor, weight: torch.Tensor, tuning: dict | None = None
) -> torch.Tensor:
    """y = x W^T for a few rows of x (a decode step of batch 1), where the time is all in reading
    W: [N, K] contiguous. float32 accumulation, like cuBLAS. `tuning` (block_n, block_k, num_warps)
    is for benchmarks/decode_kernels.py.

    Why not cuBLAS: at one row it reads the two narrow matrices of a Qwen3-0.6B layer (o_proj
    1024x2048, down_proj 1024x3072) at 0.3 and 1.0 TB/s, this kernel at 1.7 (H200, see the
    benchmark); it gains nothing from two rows on, where cuBLAS is used."""
    k_dim = x.shape[-1]
    x2 = x.reshape(-1, k_dim)
    rows, n = x2.shape[0], weight.shape[0]
    assert weight.shape[1] == k_dim and weight.stride(1) == 1 and x2.stride(-1) == 1
    block_m = triton.next_power_of_2(max(rows, 1))
    # narrow matrices: few rows per program, so that there are a few hundred programs; each asks
    # for as much of its rows at once as the registers hold (the best settings measured on an H200)
    block_n = 4 if n <= 2048 else 16
    block_k = min(triton.next_power_of_2(k_dim), 16384 // (block_m * block_n))
    tune = settings({"block_n": block_n, "block_k": block_k, "num_warps": 4}, tuning)
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    launch(
        _small_batch_linear_kernel,
        (triton.cdiv(n, tune["block_n"]) if rows else 0,),
        x2,
        weight,
        y,
        rows,
        n,
        k_dim,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=tune["block_n"],
        BLOCK_K=tune["block_k"],
        num_warps=tune["num_warps"],
    )
    return y.view(*x.shape[:-1], n)
