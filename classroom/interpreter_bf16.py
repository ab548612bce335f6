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

Its reductions have the same fault: `tl.sum`, `tl.max`, `tl.min` (and `tl.cumsum`) of a bfloat16
tile run numpy on the bits, so a sum of 32 numbers near 0.5 comes out near -6e17, and the maximum
of a tile holding negative numbers is its most negative one (a set sign bit is a large uint16).
`fix_bf16_reductions` widens such a tile to float32 first, reduces it there and rounds the result
to bfloat16 (to nearest, ties to even), so a kernel that sums a bfloat16 tile is judged on its
maths. A GPU adds in a tree of bfloat16 steps, rounding at each: its sum can differ from this one
by a few units in bfloat16's last place (0.4 % each), well inside the 2e-2 the bfloat16 tests
allow; a maximum or minimum is one of the tile's values, exact either way.
"""

from __future__ import annotations

import numpy as np

from .interpreter_dot import interpreter_modules, wrap_interpreter_dot


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


def _narrowed(data: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bits (uint16), rounded to nearest, ties to even; NaN stays NaN."""
    bits = np.asarray(data, dtype=np.float32).view(np.uint32)
    rounded = (bits + ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)) >> 16
    return np.where(np.isnan(data), np.uint32(0x7FC0), rounded).astype(np.uint16)


def fix_bf16_reductions() -> bool:
    """Patch the interpreter's reductions and scans of bfloat16 tiles once; whether they are (now)
    patched. A no-op when kernels are compiled (no TRITON_INTERPRET=1) or triton is not
    installed."""
    modules = interpreter_modules()
    if modules is None:
        return False
    tl, interpreter = modules
    reduce_ops, scan_ops = interpreter.ReduceOps, interpreter.ScanOps
    if getattr(reduce_ops, "_bf16_fixed", False):
        return True

    def narrow(r):
        """A float32 result as a bfloat16 tile (an index, from argmax, stays int32)."""
        if r.dtype.scalar != tl.float32:
            return r
        kind = r.type.with_element_ty(tl.bfloat16) if r.type.is_block() else tl.bfloat16
        handle = interpreter.TensorHandle(_narrowed(r.handle.data), tl.bfloat16)
        return tl.core.tensor(handle, kind)

    def in_float32(method):
        """`method` on a bfloat16 tile computes on its float32 values, as a tile of bits."""

        def fixed(self, input, *args, **kwargs):
            if input.dtype.scalar != tl.bfloat16:
                return method(self, input, *args, **kwargs)
            wide = tl.core.tensor(
                interpreter.TensorHandle(_widened(input.handle.data), tl.float32),
                input.type.with_element_ty(tl.float32) if input.type.is_block() else tl.float32,
            )
            out = method(self, wide, *args, **kwargs)
            if isinstance(out, (list, tuple)):
                return type(out)(narrow(r) for r in out)
            return narrow(out)

        return fixed

    reduce_ops.sum = in_float32(reduce_ops.sum)
    reduce_ops.min_max = in_float32(reduce_ops.min_max)
    scan_ops.cumsum = in_float32(scan_ops.cumsum)
    scan_ops.cumprod = in_float32(scan_ops.cumprod)
    reduce_ops._bf16_fixed = True
    return True
