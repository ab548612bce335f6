"""The block's values loaded without the mask of the keys that exist.

A key past the request's end has p = 0, so its value seems not to matter; but 0 times whatever
sits at the padding's location is NaN when that location holds NaN (or inf), and the request's
output is lost. Only the last, partial block of a request reads such locations.
"""


def online_softmax_step(
    s, V, loc, n_ok, kv_head, d, stride_vl, stride_vh, m_i, l_i, acc, IEEE: tl.constexpr
):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(V + loc[:, None] * stride_vl + kv_head * stride_vh + d[None, :])  # the bug
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
