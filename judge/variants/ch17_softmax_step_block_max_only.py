"""The new maximum taken over the block alone, not the larger of the old one and the block's.

While the maxima only rise (the largest scores in the last keys) it is the same number; once a
block's own maximum is smaller than what came before, the rescale factor exp(m_i - m_new) is
above 1, and with scores in the hundreds it overflows: inf, then NaN.
"""


def online_softmax_step(
    s, V, loc, n_ok, kv_head, d, stride_vl, stride_vh, m_i, l_i, acc, IEEE: tl.constexpr
):
    m_new = tl.max(s, axis=1)  # the bug: tl.maximum(m_i, ...) left out
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(
        V + loc[:, None] * stride_vl + kv_head * stride_vh + d[None, :],
        mask=n_ok[:, None],
        other=0.0,
    )
    acc = acc * alpha[:, None] + block_dot(p, v, IEEE)
    return m_new, l_i, acc
