"""`tl.dot(p, v)` in place of `block_dot(p, v, IEEE)`: the probabilities not cast to the values'
dtype.

With float32 caches both operands are float32 and the answer is right. The engine runs bfloat16 on
a GPU: there `p` is float32 and `v` bfloat16, and Triton refuses the kernel ("Both operands must
be same dtype"), the first time the server decodes.
"""


def online_softmax_step(
    s, V, loc, n_ok, kv_head, d, stride_vl, stride_vh, m_i, l_i, acc, IEEE: tl.constexpr
):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(
        V + loc[:, None] * stride_vl + kv_head * stride_vh + d[None, :],
        mask=n_ok[:, None],
        other=0.0,
    )
    acc = acc * alpha[:, None] + tl.dot(p, v)  # the bug: float32 p against the cache's dtype
    return m_new, l_i, acc
