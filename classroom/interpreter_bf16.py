"""bfloat16 `tl.dot` in Triton's interpreter, multiplied as numbers rather than as raw bits.

The interpreter (TRITON_INTERPRET=1, how the kernels run on a CPU) stores a bfloat16 tensor as
numpy uint16, its bits, because numpy has no bfloat16; its `tl.dot` hands those arrays to
`np.matmul` as they are, so a product of bfloat16 operands comes out as a product of integers
(around 1e9 for values near 1; Triton 3.x). Every other bfloat16 operation there converts first.
`fix_bf16_dot` makes `tl.dot` do the same: each bfloat16 operand widened to float32 (exact: a
bfloat16 is the top half of a float32), multiplied and accumulated in float32, as a GPU's tensor
cores do. With it the kernels' tests run with bfloat16 caches on a CPU, which is where a kernel
that mixes float32 probabilities with bfloat16 values fails ("Both operands must be same dtype"),
as it fails to compile on a GPU.
"""

from __future__ import annotations

import os

import numpy as np


def _widened(data: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as the float32 values they are."""
    return (data.astype(np.uint32) << 16).view(np.float32)


def fix_bf16_dot() -> bool:
    """Patch the interpreter's dot once; whether it is (now) patched. A no-op when kernels are
    compiled (no TRITON_INTERPRET=1) or triton is not installed."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_bf16_fixed", False):
        return True
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
            widen = [
                interpreter.TensorHandle(_widened(x.data), tl.float32)
                if x.dtype.scalar == tl.bfloat16
                else x
                for x in (a, b)
            ]
            a, b = widen
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._bf16_fixed = True
    builder.create_dot = create_dot
    return True
