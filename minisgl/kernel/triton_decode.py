"""Decode attention over the paged KV cache as one Triton kernel (GPU only).

One query per request. Each program takes one request, one KV head (and the query heads that share
it, padded to a 16-row tile so the products run on tensor cores) and one slice of the request's
keys ("split"), and walks that slice block by block with an online softmax: it reads the request's
own locations from its page-table row, gathers those keys and values, and keeps a running max, sum
and weighted value sum. So it reads exactly the KV the request has, whatever the other requests'
lengths, and the lengths live on the device: the launch has the same shape every step, which is what
a CUDA graph needs.

A single request with a long context would keep only a few programs busy (one per KV head), so
short batches split each request's keys into several slices and combine the partial results by
their log-sum-exp afterwards in a second small kernel ("flash decoding"). The number of slices
depends only on the batch size, never on the lengths, for the same reason.

`triton` is imported only here; nothing on the CPU path imports this module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_blocks import key_block_scores, online_softmax_step
from .triton_launch import check_vectors, launch, next_pow2, paged_kv_strides, settings
from .triton_pdl import let_next_kernel_start, pdl_aware, wait_for_previous_kernel

_TARGET_PROGRAMS = 1024  # a few waves of programs over the H200's 132 multiprocessors
_MAX_SPLITS = 16
_BLOCK_H = 16  # query heads of one KV head, padded to the smallest tensor-core tile


@pdl_aware
@triton.jit
def _paged_decode_kernel(
    Q,
    K,
    V,
    PT,
    ROWS,
    SEQLENS,
    O,
    LSE,
    stride_qb,
    stride_qh,
    stride_kl,
    stride_kh,
    stride_vl,
    stride_vh,
    stride_pt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    scale,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seqlen = tl.load(SEQLENS + b)
    row = tl.load(ROWS + b).to(tl.int64)
    # this program's slice of the keys: [start, end), a whole number of blocks long
    per_split = tl.cdiv(tl.cdiv(seqlen, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seqlen)
    wait_for_previous_kernel()  # the lengths and page table are step inputs; q and the KV are not
    let_next_kernel_start()

    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_DIM)
    h_ok = h < GROUP
    heads = kv_head * GROUP + h
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=h_ok[:, None], other=0.0
    )

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs < end
        loc = tl.load(PT + row * stride_pt + offs, mask=n_ok, other=0).to(tl.int64)
        s = key_block_scores(q, K, loc, n_ok, kv_head, d, stride_kl, stride_kh, IEEE)
        s = tl.where(n_ok[None, :], s * scale, float("-inf"))  # [BLOCK_H, BLOCK_N]
        m_i, l_i, acc = online_softmax_step(
            s, V, loc, n_ok, kv_head, d, stride_vl, stride_vh, m_i, l_i, acc, IEEE
        )

    # an empty slice (a short request in a split launch) contributes nothing: lse = -inf
    has = l_i > 0
    safe_l = tl.where(has, l_i, 1.0)
    out = acc / safe_l[:, None]
    lse = tl.where(has, m_i + tl.log(safe_l), float("-inf"))
    tl.store(
        O + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :],
        out.to(O.dtype.element_ty),
        mask=h_ok[:, None],
    )
    tl.store(LSE + b * stride_lb + heads * stride_lh + split, lse, mask=h_ok)


@triton.jit
def combine_splits(o, lse):
    """One query head's attention output from its slices' partial results.

    Receives: o [NUM_SPLITS, HEAD_DIM], each slice's softmax-weighted sum of values over its own
        keys (float32, already divided by the slice's own denominator); lse [NUM_SPLITS], the log
        of each slice's denominator, log(sum of exp(score)) over its keys, -inf for a slice that
        holds no keys (whose `o` row is all zeros). Called by `_combine_kernel`, one program per
        request and query head.
    Returns: [HEAD_DIM] float32, the softmax over all the request's keys applied to their values.
    Leaves: o and lse as they were (tiles in registers).
    Uses: `tl.exp`, `tl.max`, `tl.sum` (axis=0).
    Checked: against float64 torch attention with 1, 2, 4 and 16 slices (some empty), a slice
        holding the best-matching key, scores in the hundreds (no overflow).
    """
    # each slice's share of the whole denominator, relative to the largest (so exp never overflows)
    w = tl.exp(lse - tl.max(lse, axis=0))
    return tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)


@pdl_aware
@triton.jit
def _combine_kernel(
    O,
    LSE,
    OUT,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_outb,
    stride_outh,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Merge one (request, head)'s slices into its output."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DIM)
    wait_for_previous_kernel()
    let_next_kernel_start()
    lse = tl.load(LSE + b * stride_lb + h * stride_lh + sp)
    o = tl.load(O + b * stride_ob + h * stride_oh + sp[:, None] * stride_os + d[None, :])
    out = combine_splits(o, lse)
    tl.store(OUT + b * stride_outb + h * stride_outh + d, out.to(OUT.dtype.element_ty))


def num_splits(batch_size: int, num_kv_heads: int) -> int:
    """Slices per request: enough programs to fill the GPU. A function of the (rounded-up) batch
    size alone, so a padded CUDA-graph batch and the eager batch it stands for split alike."""
    programs = next_pow2(batch_size) * num_kv_heads
    return max(1, min(_MAX_SPLITS, next_pow2(-(-_TARGET_PROGRAMS // programs))))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seqlens: torch.Tensor,
    scale: float,
    tuning: dict | None = None,
) -> torch.Tensor:
    """q: [B, H, D]; k_cache, v_cache: [locations, Hkv, D]; page_table: [R, max_len] locations;
    rows: [B] row of each request in page_table; seqlens: [B] keys of each request.
    Returns [B, H, D] in q's dtype. `tuning` overrides the launch settings (block_n, num_warps,
    num_stages, splits), for benchmarks/decode_kernels.py."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    assert group <= _BLOCK_H, f"at most {_BLOCK_H} query heads per KV head"
    kv_strides = paged_kv_strides(q, k_cache, v_cache, page_table)
    check_vectors(rows=rows, seqlens=seqlens)
    ieee = q.dtype == torch.float32
    # 128 keys a block in 16-bit: 8-18 % faster than 64 on an H200 (benchmarks/decode_kernels.py);
    # float32 tiles take twice the shared memory
    defaults = {
        "splits": num_splits(batch, num_kv_heads),
        "block_n": 32 if ieee else 128,
        "num_warps": 4,
        "num_stages": 2,
    }
    tune = settings(defaults, tuning)
    splits, block_n = tune["splits"], tune["block_n"]
    # one slice: write the output directly; several: float32 partials, merged below
    part_dtype = q.dtype if splits == 1 else torch.float32
    part = torch.empty(batch, num_heads, splits, head_dim, dtype=part_dtype, device=q.device)
    lse = torch.empty(batch, num_heads, splits, dtype=torch.float32, device=q.device)
    launch(
        _paged_decode_kernel,
        (batch, num_kv_heads, splits),
        q,
        k_cache,
        v_cache,
        page_table,
        rows,
        seqlens,
        part,
        lse,
        *kv_strides,
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        scale,
        GROUP=group,
        BLOCK_H=_BLOCK_H,
        HEAD_DIM=head_dim,
        BLOCK_N=block_n,
        NUM_SPLITS=splits,
        IEEE=ieee,
        num_warps=tune["num_warps"],
        num_stages=tune["num_stages"],
    )
    if splits == 1:
        return part[:, :, 0]
    out = torch.empty_like(q)
    launch(
        _combine_kernel,
        (batch, num_heads),
        part,
        lse,
        out,
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        NUM_SPLITS=splits,
        HEAD_DIM=head_dim,
        num_warps=4,
    )
    return out
