"""The rows of x read K values apart (X + m * K + k) instead of at their stride.

Right for a contiguous x; the rows of a slice of a wider tensor lie stride_xm apart, so every
row but the first is read from the wrong place.
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
    x = tl.load(X + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    acc = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    for k0 in range(BLOCK_K, K, BLOCK_K):  # the other slices
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(
            W + n[:, None].to(tl.int64) * stride_wn + k[None, :],
            mask=n_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        x = tl.load(X + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    tl.store(
        Y + m[:, None] * stride_ym + n[None, :],
        acc.to(Y.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )
