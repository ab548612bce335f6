"""The float32 sum x + residual normalized, where torch normalizes the sum rounded to the dtype.

The residual stored is right (rounded); in bfloat16 the row normalized is not the one torch
normalizes, so the output is a rounding away from torch's in many places.
"""


@triton.jit
def _add_rms_norm_kernel(
    X,
    R,
    W,
    Y,
    R_OUT,
    stride_x,
    stride_r,
    stride_y,
    stride_ro,
    n,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    w = tl.load(W + cols, mask=ok, other=0.0)  # a weight: read before the previous kernel ends
    wait_for_previous_kernel()
    let_next_kernel_start()
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:  # residual = x + residual, rounded to the dtype as torch's add does
        r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0)
        s = x.to(tl.float32) + r.to(tl.float32)
        tl.store(R_OUT + row * stride_ro + cols, s.to(X.dtype.element_ty), mask=ok)
        xf = s  # the bug: the float32 sum, not the rounded one
    else:
        xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n
    y = (xf * tl.rsqrt(var + eps)).to(X.dtype.element_ty)
    tl.store(
        Y + row * stride_y + cols,
        (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty),
        mask=ok,
    )
