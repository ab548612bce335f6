"""Batch 1's add + RMSNorm fused into the projection after it
(minisgl/kernel/triton_norm_linear.py), against the separate ops it replaces: rms_norm(x +
residual) then x W^T, and with `gated` the MLP's silu_and_mul of the product. On the CPU in
Triton's interpreter (TRITON_INTERPRET=1, set by conftest), compiled with `--device cuda`; and
the separate SiLU·mul kernel, whose rounding the gated product shares (triton_silu.silu_mul)."""

from __future__ import annotations

import pytest
import torch

from extras import module_needs_extra
from helpers import test_device
from minisgl.kernel import ops

pytestmark = module_needs_extra("triton")  # before the imports that need it

from minisgl.kernel import triton_norm_linear, triton_silu  # noqa: E402  (imports triton)

EPS = 1e-6
BF16_ROUNDING = 2**-7  # see tests/test_ch19_kernels.py: the interpreter truncates to bfloat16


def rand(*shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(test_device())


def unfused(x, residual, norm_w, weight, gated):
    if residual is None:
        h, summed = ops.rms_norm(x, norm_w, EPS), x
    else:
        h, summed = ops.fused_add_rms_norm(x, residual, norm_w, EPS)
    y = torch.nn.functional.linear(h.double(), weight.double()).to(x.dtype)
    return (ops.silu_and_mul(y) if gated else y), summed


# (hidden, rows of W): a hidden size that is not a power of two (96: the block is 128) and outputs
# that are not a multiple of the programs' rows (40 rows, 16 a program), several programs
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "first-layer"])
@pytest.mark.parametrize("hidden,rows", [(64, 40), (96, 72)])
def test_norm_then_projection_in_one_kernel_equals_the_separate_ops(
    gated, with_residual, hidden, rows
):
    x, w = rand(1, hidden, seed=1), rand(rows, hidden, seed=2) / hidden**0.5
    residual = rand(1, hidden, seed=3) if with_residual else None
    norm_w = rand(hidden, seed=4)
    got, summed = triton_norm_linear.norm_linear(x, residual, norm_w, EPS, w, gated)
    want, want_summed = unfused(x, residual, norm_w, w, gated)
    assert got.shape == want.shape == (1, rows // 2 if gated else rows)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(summed, want_summed, atol=0, rtol=0)
    if with_residual:
        assert summed.data_ptr() not in (x.data_ptr(), residual.data_ptr())


def test_bfloat16_rounds_where_the_separate_kernels_round():
    hidden, rows = 128, 48
    x, w = rand(1, hidden, dtype=torch.bfloat16, seed=5), rand(rows, hidden, seed=6)
    w = (w / hidden**0.5).to(torch.bfloat16)
    residual, norm_w = rand(1, hidden, dtype=torch.bfloat16, seed=7), rand(hidden, seed=8)
    norm_w = norm_w.to(torch.bfloat16)
    for gated in (False, True):
        got, summed = triton_norm_linear.norm_linear(x, residual, norm_w, EPS, w, gated)
        want, want_summed = unfused(x, residual, norm_w, w, gated)
        torch.testing.assert_close(summed, want_summed, atol=1e-6, rtol=BF16_ROUNDING)
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=2 * BF16_ROUNDING)


def test_only_one_row_of_a_hidden_size_a_block_holds_is_fused():
    w = rand(8, 64)
    assert triton_norm_linear.fits(rand(1, 64), w)
    assert not triton_norm_linear.fits(rand(2, 64), w)  # batch 2: the separate kernels
    assert not triton_norm_linear.fits(rand(1, 64), rand(64, 8).T)  # not contiguous
    big = rand(1, 8192)
    assert not triton_norm_linear.fits(big, rand(2, 8192))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_silu_mul_kernel_rounds_as_ops_does(dtype):
    # 3 rows of gate | up, 1500 wide: two blocks of 1024 columns, the second one partial
    x = rand(3, 3000, seed=9).mul(4).to(dtype)
    got, want = triton_silu.silu_and_mul(x), ops.silu_and_mul(x)
    assert got.shape == want.shape == (3, 1500) and got.dtype == dtype
    rtol = 1e-6 if dtype == torch.float32 else 2 * BF16_ROUNDING
    torch.testing.assert_close(got.float(), want.float(), atol=1e-6, rtol=rtol)
