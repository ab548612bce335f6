"""bfloat16 `tl.dot` in Triton's interpreter, multiplied as numbers rather than as raw bits.

The interpreter (TRITON_INTERPRET=1, how the kernels run on a CPU) stores a bfloat16 tensor as
numpy uint16, its bits, because numpy has no bfloat16; its `tl.dot` hands those arrays to
`np.matmul` as they are, so a product of bfloat16 operands comes out as a product of integers
(around 1e9 for values near 1; Triton 3.x). Conversions (`.to(...)`) and loads and stores are
right; arithmetic on the bits is not, and `fix_bf16_dot`, `fix_bf16_reductions` and
`fix_bf16_elementwise` mend it where the kernels meet it.
`fix_bf16_dot` makes `tl.dot` compute on numbers: each bfloat16 operand widened to float32 (exact: a
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

Element-wise arithmetic has it too: `x * y`, `x + y`, `-x`, `tl.maximum(x, y)`, a comparison
`x < y` of bfloat16 tiles run numpy on the bits, so [1, 2, 0.5, 3] * [0.25, 0.75, 1, -1] comes out
as [-2, 0, -0, -3.7e19] and `v * 1.0` fills a tile with garbage; a cast between bfloat16 and an
integer type converts the bits as if they were the number (a mask `.to(tl.bfloat16)` gives 0 and
1e-45). `fix_bf16_elementwise` casts those through float32, and widens every bfloat16 operand of
the interpreter's element-wise builders to float32, computes there and rounds the result to
bfloat16 (to nearest, ties to even), which is what a GPU gives for one operation: it computes a
bfloat16 `*` or `+` in float32 and rounds once.
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


# the builder's methods that compute on their operands' values, each taking and returning
# TensorHandles: binary_op (+, -, *, /, %, min, max, comparisons), unary_op (negation, exp, log,
# sqrt, sin, cos, floor, ceil), ternary_op (where, clamp), fma, rsqrt, erf; and casts between
# bfloat16 and integers (cast_impl)
ELEMENTWISE = ("binary_op", "unary_op", "ternary_op", "create_fma", "create_rsqrt", "create_erf")


def fix_bf16_elementwise() -> bool:
    """Patch the interpreter's element-wise arithmetic on bfloat16 tiles once; whether it is (now)
    patched. A no-op when kernels are compiled (no TRITON_INTERPRET=1) or triton is not
    installed."""
    modules = interpreter_modules()
    if modules is None:
        return False
    tl, interpreter = modules
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_bf16_elementwise_fixed", False):
        return True
    handle_type = interpreter.TensorHandle

    def is_bf16(x) -> bool:
        return isinstance(x, handle_type) and x.dtype == tl.bfloat16

    def in_float32(method):
        """`method` with every bfloat16 operand widened to float32, and a float32 result rounded
        back to bfloat16 (a comparison's booleans stay booleans, of the operands' type as the
        interpreter gives them)."""

        def fixed(self, *args):
            if not any(is_bf16(a) for a in args):
                return method(self, *args)
            wide = [handle_type(_widened(a.data), tl.float32) if is_bf16(a) else a for a in args]
            out = method(self, *wide)
            if out.data.dtype == np.float32:
                return handle_type(_narrowed(out.data), tl.bfloat16)
            # a comparison: booleans, typed as such (the interpreter types them as its operands,
            # and a later `.to(tl.bfloat16)` would then keep the bits 0 and 1)
            return handle_type(out.data, tl.int1 if out.data.dtype == np.bool_ else out.dtype)

        return fixed

    for name in ELEMENTWISE:
        setattr(builder, name, in_float32(getattr(builder, name)))

    cast = builder.cast_impl

    def cast_through_float32(self, src, dst_type):
        """Between bfloat16 and an integer type (a mask's booleans included), through float32:
        the interpreter's own cast converts the bits as if they were the number."""
        frm, to = src.dtype.scalar, dst_type.scalar
        floats = (tl.float32, tl.bfloat16)
        if frm == tl.bfloat16 and to not in floats:
            return cast(self, handle_type(_widened(src.data), tl.float32), dst_type)
        if to == tl.bfloat16 and frm not in floats:
            return handle_type(_narrowed(cast(self, src, tl.float32).data), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_through_float32
    builder._bf16_elementwise_fixed = True
    return True
