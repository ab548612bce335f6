"""TF32 `tl.dot` in Triton's interpreter, rounded as a GPU's tensor cores round it.

`tl.dot` of two float32 blocks runs, on an NVIDIA GPU since Ampere, in TF32 unless asked for
`input_precision="ieee"` (or `allow_tf32=False`): each operand keeps 10 of float32's 23 mantissa
bits, a relative error near 1e-3 per product. The interpreter (TRITON_INTERPRET=1, how the kernels
run on a CPU) ignores `input_precision` and always multiplies full float32 values, so a kernel that
forgets "ieee" is exact there and wrong only on a GPU. `honour_tf32_dot` makes the interpreter's
`tl.dot` round each float32 operand to TF32 (to nearest, ties away from zero, as PTX's
cvt.rna.tf32.f32 does) when TF32 was asked for, so the CPU sees what the GPU computes.
"""

from __future__ import annotations

import numpy as np

from .interpreter_dot import wrap_interpreter_dot

HALF_DROPPED = np.uint32(1 << 12)  # half of the 13 mantissa bits TF32 drops
KEPT = np.uint32(0xFFFFE000)  # sign, exponent and the top 10 mantissa bits


def tf32_rounded(data: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32's 10-bit mantissa (inf and NaN as they are)."""
    data = np.ascontiguousarray(data, dtype=np.float32)
    with np.errstate(over="ignore"):
        rounded = ((data.view(np.uint32) + HALF_DROPPED) & KEPT).view(np.float32)
    return np.where(np.isfinite(data), rounded, data)


def _round_tf32(a, b, input_precision, tl, interpreter):
    tf32 = getattr(input_precision, "name", str(input_precision)) == "TF32"
    # a GPU uses TF32 only when both operands are float32 (bfloat16 has its own tensor cores)
    if tf32 and a.dtype.scalar == tl.float32 and b.dtype.scalar == tl.float32:
        return tuple(interpreter.TensorHandle(tf32_rounded(x.data), tl.float32) for x in (a, b))
    return a, b


def honour_tf32_dot() -> bool:
    """Patch the interpreter's dot once; whether it is (now) patched. A no-op when kernels are
    compiled (no TRITON_INTERPRET=1) or triton is not installed."""
    return wrap_interpreter_dot("tf32", _round_tf32)
