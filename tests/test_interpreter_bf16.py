"""classroom/interpreter_bf16.py: Triton's interpreter computes on bfloat16 numbers, not on their
bits, as a GPU does.

The interpreter keeps a bfloat16 tile as numpy uint16 bits; unpatched, `x * y` of two such tiles
multiplies the integers ([1, 2, 0.5, 3] * [0.25, 0.75, 1, -1] came out as [-2, 0, -0, -3.7e19]),
so a right kernel that scales a bfloat16 tile (`v * 1.0`) failed the bfloat16 tests on a CPU only.
Each case here is one element-wise builder, compared with torch's bfloat16 arithmetic (one
rounding of the float32 result). With `--device cuda` the kernel is compiled and the same
comparison checks the GPU.
"""

from __future__ import annotations

import pytest
import torch

from extras import module_needs_extra

pytestmark = module_needs_extra("triton")  # before the imports that need it

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from classroom.interpreter_bf16 import (  # noqa: E402
    fix_bf16_dot,
    fix_bf16_elementwise,
    fix_bf16_reductions,
)
from helpers import test_device  # noqa: E402

fix_bf16_dot()
fix_bf16_reductions()
fix_bf16_elementwise()

# tl.exp and the other math functions take float32 only, on a GPU too
OPS = ["mul", "add", "sub", "div", "neg", "maximum", "less", "where", "scale", "fma", "to_int"]


@triton.jit
def _elementwise(x_ptr, y_ptr, out_ptr, OP: tl.constexpr):
    i = tl.arange(0, 8)
    x = tl.load(x_ptr + i)  # bfloat16 tiles
    y = tl.load(y_ptr + i)
    if OP == "mul":
        r = x * y
    elif OP == "add":
        r = x + y
    elif OP == "sub":
        r = x - y
    elif OP == "div":
        r = x / y
    elif OP == "neg":
        r = -x
    elif OP == "to_int":
        r = (x * 4.0).to(tl.int32).to(tl.bfloat16)  # a cast to an integer and back
    elif OP == "maximum":
        r = tl.maximum(x, y)
    elif OP == "less":
        r = (x < y).to(tl.bfloat16)
    elif OP == "where":
        r = tl.where(x < y, x, y)
    elif OP == "scale":
        r = x * 1.0
    else:
        r = tl.fma(x, y, x)
    tl.store(out_ptr + i, r.to(tl.float32))


def _expected(op: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return {
        "mul": lambda: x * y,
        "add": lambda: x + y,
        "sub": lambda: x - y,
        "div": lambda: x / y,
        "neg": lambda: -x,
        "to_int": lambda: (x * 4.0).to(torch.int32).to(torch.bfloat16),
        "maximum": lambda: torch.maximum(x, y),
        "less": lambda: (x < y).to(torch.bfloat16),
        "where": lambda: torch.where(x < y, x, y),
        "scale": lambda: x * 1.0,
        "fma": lambda: (x.float() * y.float() + x.float()).bfloat16(),
    }[op]().float()


@pytest.mark.parametrize("op", OPS)
def test_bfloat16_elementwise_arithmetic_computes_on_the_numbers(op):
    device = test_device()
    x = torch.tensor([1.0, 2.0, 0.5, 3.0, -1.5, 0.0, -0.25, 7.0], dtype=torch.bfloat16)
    y = torch.tensor([0.25, 0.75, 1.0, -1.0, -2.0, 3.0, -0.125, 0.5], dtype=torch.bfloat16)
    out = torch.zeros(8, device=device)
    _elementwise[(1,)](x.to(device), y.to(device), out, OP=op)
    want = _expected(op, x, y)
    got = out.cpu()
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-6), (
        f"bfloat16 {op} of {x.tolist()} and {y.tolist()}: got {got.tolist()}, expected "
        f"{want.tolist()} (the interpreter computing on the bits, not the numbers?)"
    )
