"""Chapter 19: two Triton kernels of minisgl/kernel/triton_ops.py, judged against plain torch.

The fused add + RMSNorm (`_add_rms_norm_kernel`, launched by `rms_norm` and `fused_add_rms_norm`)
and the small-batch matrix-vector product (`_small_batch_linear_kernel`, launched by
`small_batch_linear`). On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set
by conftest), on CPU tensors; with `--device cuda` the same tests run them compiled. The shapes are
small and chosen to catch the usual slips: a size that is not a multiple of the block (the masked
tail must add nothing), one row and several (each program finds its own row by its stride), a
low-precision dtype (the sums must be float32), eps inside the root.
"""

from __future__ import annotations

import pytest
import torch

from extras import module_needs_extra
from helpers import assert_tensors_close, test_device
from minisgl.kernel import ops

pytestmark = module_needs_extra("triton")  # before the imports that need it

from minisgl.kernel import triton_ops  # noqa: E402  (imports triton)

EPS = 1e-6
# One rounding of bfloat16 (8 significant bits), relative. Triton's interpreter (3.9) converts
# float32 to bfloat16 by truncation where torch and the compiled kernels round to nearest, so on the
# CPU a bfloat16 result may be one unit of the last place away from torch's even when exact.
BF16_ROUNDING = 2**-7


def rand(*shape, dtype=torch.float32, seed=0, scale=1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(test_device())


assert_close = assert_tensors_close  # one line on a mismatch (tests/helpers.py)


# ---------------------------------------------------------------------- add + RMSNorm

# (rows, hidden): hidden sizes that are and are not powers of two (the block is the next power of
# two: 50 leaves 14 masked lanes, 96 leaves 32), batch 1 and several rows
NORM_SHAPES = [(1, 64), (1, 50), (5, 96), (3, 7)]


@pytest.mark.parametrize("rows,hidden", NORM_SHAPES)
def test_rms_norm_kernel_equals_torch_in_float32(rows, hidden):
    x = rand(rows, hidden, seed=1)
    w = rand(hidden, seed=2)
    got = triton_ops.rms_norm(x, w, EPS)
    assert_close(got, ops.rms_norm(x, w, EPS), f"rms_norm of [{rows}, {hidden}]", atol=2e-6)


@pytest.mark.parametrize("rows,hidden", NORM_SHAPES)
def test_fused_add_rms_norm_returns_the_norm_of_the_sum_and_the_sum(rows, hidden):
    x, r, w = rand(rows, hidden, seed=3), rand(rows, hidden, seed=4), rand(hidden, seed=5)
    x0, r0 = x.clone(), r.clone()
    y, summed = triton_ops.fused_add_rms_norm(x, r, w, EPS)
    want_y, want_sum = ops.fused_add_rms_norm(x0, r0, w, EPS)
    assert_close(summed, want_sum, "the residual returned (x + residual)", atol=0.0)
    assert_close(y, want_y, "the normalized output", atol=2e-6)
    assert torch.equal(x, x0) and torch.equal(r, r0), "x and residual must be left as they were"


def test_bfloat16_sums_in_float32_and_rounds_like_torch():
    # 300 values of one row: summed in bfloat16 the mean of squares is off by percents
    x, r = rand(2, 300, dtype=torch.bfloat16, seed=6), rand(2, 300, dtype=torch.bfloat16, seed=7)
    w = rand(300, dtype=torch.bfloat16, seed=8)
    y, summed = triton_ops.fused_add_rms_norm(x, r, w, EPS)
    want_y, want_sum = ops.fused_add_rms_norm(x, r, w, EPS)
    one = dict(atol=0.0, rtol=BF16_ROUNDING)
    assert_close(summed, want_sum, "bfloat16 residual (x + residual, rounded once)", **one)
    # rounded to bfloat16 before the weight and after it, as torch does: within two roundings of
    # torch's, four after a residual that may itself be a rounding off
    two = dict(atol=1e-6, rtol=2 * BF16_ROUNDING)
    assert_close(y, want_y, "bfloat16 rms_norm of x + residual", atol=1e-6, rtol=4 * BF16_ROUNDING)
    plain = triton_ops.rms_norm(x, w, EPS)
    assert_close(plain, ops.rms_norm(x, w, EPS), "bfloat16 rms_norm without residual", **two)


def round_as_the_kernel_does(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 `t` to `dtype` as the kernel's casts round it: to nearest when compiled, by
    truncation (the low 16 bits dropped) in the interpreter."""
    if dtype != torch.bfloat16 or test_device() != "cpu":
        return t.to(dtype)
    return (t.float().contiguous().view(torch.int32) & -65536).view(torch.float32).to(dtype)


def test_bfloat16_rounds_where_torch_rounds():
    # the order of ops.fused_add_rms_norm, its casts made as the kernel's round: the sum rounded
    # to bfloat16 before it is normalized, the normalized row before the weight multiplies it
    x, r = rand(4, 300, dtype=torch.bfloat16, seed=20), rand(4, 300, dtype=torch.bfloat16, seed=21)
    w = rand(300, dtype=torch.bfloat16, seed=22)
    y, summed = triton_ops.fused_add_rms_norm(x, r, w, EPS)
    s = round_as_the_kernel_does(x.float() + r.float(), torch.bfloat16)
    sf = s.float()
    norm = sf * torch.rsqrt((sf * sf).sum(-1, keepdim=True) / 300 + EPS)
    want = round_as_the_kernel_does(
        w.float() * round_as_the_kernel_does(norm, torch.bfloat16).float(), torch.bfloat16
    )
    assert torch.equal(summed, s), "the residual must be x + residual rounded once to bfloat16"
    assert_close(y, want, "bfloat16 rms_norm", atol=1e-6, rtol=BF16_ROUNDING)
    # the sums of squares differ in their order (a tree in the kernel): a rare value may round
    # the other way, never a tenth of them
    off = int((y != want).sum())
    assert off <= want.numel() // 100, (
        f"{off} of {want.numel()} bfloat16 values are a rounding away from torch's order of "
        "roundings (sum rounded to bfloat16, normalized in float32, rounded, times the weight, "
        "rounded)"
    )


def test_eps_is_added_to_the_mean_square_inside_the_root():
    # values of 1e-3: mean square 1e-6, so eps = 1e-4 dominates the root; eps outside it would not
    x = torch.full((2, 40), 1e-3, device=test_device())
    x[1] *= -2.0
    w = torch.ones(40, device=test_device())
    got = triton_ops.rms_norm(x, w, 1e-4)
    assert_close(got, ops.rms_norm(x, w, 1e-4), "rms_norm with a large eps", atol=1e-6, rtol=1e-5)


def test_each_row_is_read_at_its_stride():
    # the rows of a slice of a wider tensor lie 80 values apart, not 48; the residual's 64 apart
    wide, wide_r = rand(4, 80, seed=9), rand(4, 64, seed=10)
    x, r = wide[:, :48], wide_r[:, :48]
    w = rand(48, seed=11)
    y, summed = triton_ops.fused_add_rms_norm(x, r, w, EPS)
    want_y, want_sum = ops.fused_add_rms_norm(x, r, w, EPS)
    assert_close(summed, want_sum, "the residual of strided rows", atol=0.0)
    assert_close(y, want_y, "the norm of strided rows", atol=2e-6)


def test_leading_dimensions_are_kept():
    x, w = rand(2, 3, 24, seed=12), rand(24, seed=13)
    assert_close(triton_ops.rms_norm(x, w, EPS), ops.rms_norm(x, w, EPS), "[2, 3, 24]", atol=2e-6)


# ---------------------------------------------------------------------- small-batch GEMV

# (rows, N, K, tuning): N not a multiple of the rows a program takes, K not a multiple of the
# slice of K read at a time (block_k 32 over K = 100: four slices, the last masked), 1 and 3 rows
GEMV_CASES = [
    (1, 37, 100, {"block_k": 32}),
    (3, 37, 100, {"block_k": 32}),
    (1, 16, 64, None),
    (2, 20, 200, {"block_n": 8, "block_k": 64}),
]


@pytest.mark.parametrize("rows,n,k,tuning", GEMV_CASES)
def test_small_batch_linear_equals_torch_in_float32(rows, n, k, tuning):
    x, w = rand(rows, k, seed=14), rand(n, k, seed=15)
    got = triton_ops.small_batch_linear(x, w, tuning)
    want = x.double() @ w.double().T
    assert_close(got, want.float(), f"x [{rows}, {k}] @ W [{n}, {k}]^T", atol=1e-4, rtol=1e-5)


def test_small_batch_linear_accumulates_bfloat16_products_in_float32():
    # 512 products of about 1: a bfloat16 running sum keeps 8 bits and drifts by several units
    x = rand(1, 512, dtype=torch.bfloat16, seed=16)
    w = rand(24, 512, dtype=torch.bfloat16, seed=17)
    got = triton_ops.small_batch_linear(x, w, {"block_k": 64})
    want = (x.double() @ w.double().T).to(torch.bfloat16)  # exact sum, rounded once
    assert_close(got, want, "bfloat16 x @ W^T", atol=1e-6, rtol=BF16_ROUNDING)


def test_small_batch_linear_reads_rows_of_x_at_their_stride_and_keeps_leading_dims():
    wide = rand(2, 1, 90, seed=18)
    x = wide[..., :60]
    w = rand(12, 60, seed=19)
    want = (x.double() @ w.double().T).float()
    got = triton_ops.small_batch_linear(x, w, {"block_k": 16})
    assert_close(got, want, "strided x, K in slices of 16", atol=1e-4, rtol=1e-5)
    # one slice of 64 for K = 60: the four lanes past K hold x's next values and W's next row
    got = triton_ops.small_batch_linear(x, w)
    assert_close(got, want, "strided x, K in one slice of 64", atol=1e-4, rtol=1e-5)
