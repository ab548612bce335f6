"""The steps that the paged prefill and decode kernels share, for one block of keys: their
scores against a tile of queries, and folding that block into an online softmax (the running
max, sum and weighted sum of values of flash attention). Triton inlines them into each kernel.

`triton` is imported only here and in the kernels; nothing on the CPU path imports this module.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def key_block_scores(q, K, loc, n_ok, kv_head, d, stride_kl, stride_kh, IEEE: tl.constexpr):
    """q [M, HEAD_DIM] against one KV head's keys at locations `loc` [N] (those with n_ok):
    [M, N] dot products, unscaled."""
    # [HEAD_DIM, N]
    k = tl.load(
        K + loc[None, :] * stride_kl + kv_head * stride_kh + d[:, None],
        mask=n_ok[None, :],
        other=0.0,
    )
    if IEEE:  # float32 caches: full-precision products, as the reference computes
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    return s


@triton.jit
def block_dot(a, b, IEEE: tl.constexpr):
    """a [M, K] times b [K, N] with tl.dot, `a` cast to b's dtype first (probabilities against
    bfloat16 values run on the tensor cores, as FlashAttention does); full float32 products when
    IEEE (float32 caches, as the reference computes)."""
    if IEEE:
        out = tl.dot(a.to(b.dtype), b, input_precision="ieee")
    else:
        out = tl.dot(a.to(b.dtype), b)
    return out


@triton.jit
def online_softmax_step(
    s, V, loc, n_ok, kv_head, d, stride_vl, stride_vh, m_i, l_i, acc, IEEE: tl.constexpr
):
    """Fold a block of scaled scores s [M, N] (-inf where a key is not visible) and the values at
    `loc` into the running max m_i [M], sum l_i [M] and weighted value sum acc [M, HEAD_DIM]."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # [N, HEAD_DIM]
    v = tl.load(
        V + loc[:, None] * stride_vl + kv_head * stride_vh + d[None, :],
        mask=n_ok[:, None],
        other=0.0,
    )
    acc = acc * alpha[:, None] + block_dot(p, v, IEEE)
    return m_new, l_i, acc
