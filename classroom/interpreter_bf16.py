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

import numpy as np

from .interpreter_dot import wrap_interpreter_dot


def _widened(data: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as the float32 values they are."""
    return (data.astype(np.uint32) << 16).view(np.float32)


def _widen_bf16(a, b, input_precision, tl, interpreter):
    return tuple(
        interpreter.TensorHandle(_widened(x.data), tl.float32)
        if x.dtype.scalar == tl.bfloat16
        else x
        for x in (a, b)
    )


def fix_bf16_dot() -> bool:
    """Patch the interpreter's dot once; whether it is (now) patched. A no-op when kernels are
    compiled (no TRITON_INTERPRET=1) or triton is not installed."""
    return wrap_interpreter_dot("bf16", _widen_bf16)
