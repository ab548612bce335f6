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
    """Fold one block of keys into a running softmax (flash attention's online step).

    Receives: s [M, N], the block's scaled scores (-inf where a key is not visible); V, the value
        cache, and the block's locations `loc` [N] with n_ok [N] (false past the keys), kv_head,
        d = arange(HEAD_DIM) and the strides, laid out as `key_block_scores` reads keys; m_i [M],
        l_i [M], acc [M, HEAD_DIM]: the running max, sum of exp(score - m_i) and weighted value
        sum over the keys before this block (m_i -inf, l_i and acc 0 before the first); IEEE
        (float32 caches). Called by the decode and prefill kernels, once per key block.
    Returns: (m_new, l_i, acc) describing the keys so far including this block, as if their
        softmax had been taken at once: acc / l_i is then their attention.
    Leaves: the value cache as it was; a key not in n_ok adds nothing (its value counts as 0,
        whatever its location holds: masked in the load, or replaced after it).
    Uses: `tl.maximum`, `tl.max`, `tl.exp`, `tl.sum`, `tl.load` with a mask, `block_dot`.
    Checked: against float64 torch attention for 1 to 70 keys (up to three blocks), GQA 1/2/8,
        pages of 1 and 4, 1 to 16 slices, scores in the hundreds with the largest in the last
        block and in the first, prefill after cached prefixes; unowned cache locations hold NaN.
    """
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
