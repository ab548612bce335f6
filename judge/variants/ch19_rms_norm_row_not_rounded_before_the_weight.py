"""The normalized row multiplied by the weight in float32, without its rounding to x's dtype first.

The same in float32; in bfloat16 Hugging Face's order (ops.rms_norm) rounds the normalized row,
then the product: one rounding fewer here, so some values land a rounding away from torch's.
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
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(R_OUT + row * stride_ro + cols, x, mask=ok)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n
    y = xf * tl.rsqrt(var + eps)  # the bug: not rounded to the dtype before the weight
    tl.store(
        Y + row * stride_y + cols,
        (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty),
        mask=ok,
    )
