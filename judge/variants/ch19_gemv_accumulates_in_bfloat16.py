"""The running sum kept in the output's dtype: each slice's products added to an accumulator
rounded to bfloat16.

In float32 nothing changes; in bfloat16 every slice's addition rounds to 8 bits.
"""


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
    """BLOCK_N rows of W against every row of x: products summed in float32 over K. Each program
    asks for a large slice of W at once, which is what keeps enough bytes in flight to stream the
    weights at the memory's speed."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
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
        acc = (
            (acc + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2))
            .to(Y.dtype.element_ty)
            .to(tl.float32)
        )  # the bug: rounded each slice
    tl.store(
        Y + m[:, None] * stride_ym + n[None, :],
        acc.to(Y.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )
