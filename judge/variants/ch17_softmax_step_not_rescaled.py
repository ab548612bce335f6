"""The running sum and accumulator carried over without rescaling when the maximum rises.

Each block's terms are exp(s - new max), but what was summed before is still measured against the
old maximum: the earlier keys weigh too much by exp(new max - old max). With one block of keys
there is nothing earlier, so a short request looks right.
"""


def online_softmax_step(
    s, V, loc, n_ok, kv_head, d, stride_vl, stride_vh, m_i, l_i, acc, IEEE: tl.constexpr
):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp(s - m_new[:, None])
    l_i = l_i + tl.sum(p, axis=1)  # the bug: no l_i * exp(m_i - m_new)
    v = tl.load(
        V + loc[:, None] * stride_vl + kv_head * stride_vh + d[None, :],
        mask=n_ok[:, None],
        other=0.0,
    )
    if IEEE:
        acc = acc + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
