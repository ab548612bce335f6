"""The judge swaps a learner's Triton kernel (chapter 19's exercises) into triton_ops: the launch
wrappers must run the learner's code, interpreted on a CPU or compiled on a GPU (where Triton's
cache, keyed by the kernel's source, must not hand back the reference's binary), and a kernel that
cannot load must fail its launches with the reason, not with "'function' object is not
subscriptable"."""

from __future__ import annotations

import pytest
import torch

from extras import module_needs_extra
from helpers import test_device
from judge import swap
from judge.function_wrapping import LearnerCodeError
from judge.protocol import ExerciseSpec, SnippetSpec, UnitSpec

pytestmark = module_needs_extra("triton")  # before the imports that need it

from minisgl.kernel import triton_ops  # noqa: E402  (imports triton)

TARGET = "minisgl.kernel.triton_ops:_add_rms_norm_kernel"
# the engine's signature, a different body: y = 2 x, so its launches are told from the reference's
DOUBLES = """
def _add_rms_norm_kernel(
    X, R, W, Y, R_OUT, stride_x, stride_r, stride_y, stride_ro, n, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    tl.store(Y + row * stride_y + cols, x * 2.0, mask=ok)
"""


@pytest.fixture
def restored():
    """The engine's kernel back in place after the test, whatever the swap did."""
    original = triton_ops._add_rms_norm_kernel
    yield
    triton_ops._add_rms_norm_kernel = original


def swap_in(source: str) -> swap.SwapState:
    unit = UnitSpec(
        chapter="ch19",
        origin="test",
        missing="error",
        snippets=[SnippetSpec("learner.py", source, "add_rms_norm_kernel")],
        exercises=[ExerciseSpec("ch19.add_rms_norm_kernel", "add_rms_norm_kernel", TARGET, True)],
    )
    return swap.apply([unit])


@pytest.mark.parametrize("decorated", [False, True], ids=["plain-def", "with-triton-jit"])
def test_the_wrappers_launch_the_learners_kernel(restored, decorated):
    x = torch.randn(3, 40, device=test_device())
    w = torch.ones(40, device=test_device())
    reference = triton_ops.rms_norm(x, w, 1e-6)  # compiles (or interprets) the reference first
    state = swap_in(("@triton.jit" if decorated else "") + DOUBLES)
    assert not state.report.problems, state.report.problems
    kernel = triton_ops._add_rms_norm_kernel
    assert type(kernel).__module__.startswith("triton."), f"not a Triton kernel: {kernel!r}"
    got = triton_ops.rms_norm(x, w, 1e-6)
    assert torch.equal(got, 2 * x), (
        "rms_norm launched something else than the learner's kernel "
        f"(the reference's output: {torch.allclose(got, reference)})"
    )


def test_a_kernel_that_cannot_load_fails_its_launches_with_the_reason(restored):
    state = swap_in(DOUBLES.replace("row = tl.program_id(0)", "row = = 1"))
    assert "ch19.add_rms_norm_kernel" in state.report.problems
    x = torch.randn(2, 8, device=test_device())
    with pytest.raises(LearnerCodeError, match="SyntaxError"):
        triton_ops.rms_norm(x, torch.ones(8, device=test_device()), 1e-6)
