"""The residual's rows found at x's stride (stride_x where stride_r belongs).

Right whenever x and the residual are laid out alike, as in the engine; a residual whose rows lie
at another distance than x's is read from the wrong places.
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
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:  # residual = x + residual, rounded to the dtype as torch's add does
        r = tl.load(R + row * stride_x + cols, mask=ok, other=0.0)  # the bug: x's stride
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(R_OUT + row * stride_ro + cols, x, mask=ok)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n
    y = (xf * tl.rsqrt(var + eps)).to(X.dtype.element_ty)
    w = tl.load(W + cols, mask=ok, other=0.0)
    tl.store(
        Y + row * stride_y + cols,
        (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty),
        mask=ok,
    )
