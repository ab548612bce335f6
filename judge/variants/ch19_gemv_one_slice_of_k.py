"""Only the first BLOCK_K columns of K are summed: the loop over K's slices stops after one.

Right whenever K fits in one slice (the default block_k is K's next power of two up to 2048).
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
    for k0 in range(0, BLOCK_K, BLOCK_K):  # the bug: one slice
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
