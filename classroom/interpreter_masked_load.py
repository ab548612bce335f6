"""Masked-off lanes of a `tl.load` without `other=`, poisoned in Triton's interpreter.

Triton leaves the lanes a load's mask turns off undefined unless `other=` gives them a value: on a
GPU they hold whatever the registers held, which may be a NaN or an infinity from an earlier tile,
and one such lane in a `tl.dot` or a sum spoils every value it meets (0 × NaN is NaN). The
interpreter (TRITON_INTERPRET=1, how the kernels run on a CPU) fills them with zeros, so a kernel
that reads lanes it never defined computes the right numbers there and the mistake shows only on
some GPU, some day. `poison_masked_loads` fills them with NaN instead, for floating-point loads
(bfloat16, stored by the interpreter as its bits, gets a bfloat16 NaN): a kernel that uses a
masked-off lane's value fails on a CPU, as it may on a GPU, and one that gives `other=` or never
uses those lanes is unaffected. Integer loads keep the interpreter's zeros: an index read under a
mask is used under the same mask, and a poison there would only be a different undefined number.
"""

from __future__ import annotations

import numpy as np

from .interpreter_dot import interpreter_modules

_BF16_NAN_BITS = 0x7FC0


def poison_masked_loads() -> bool:
    """Patch the interpreter's masked load once; whether it is (now) patched. A no-op when kernels
    are compiled (no TRITON_INTERPRET=1) or triton is not installed."""
    modules = interpreter_modules()
    if modules is None:
        return False
    tl, interpreter = modules
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_masked_load, "_poisons", False):
        return True
    original = builder.create_masked_load

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        dtype = ptrs.get_element_ty()
        if other is None and dtype in (tl.bfloat16, tl.float16, tl.float32, tl.float64):
            if dtype == tl.bfloat16:
                poison = np.full(ptrs.data.shape, _BF16_NAN_BITS, dtype=np.uint16)
            else:
                poison = np.full(ptrs.data.shape, np.nan, dtype=interpreter._get_np_dtype(dtype))
            other = interpreter.TensorHandle(poison, dtype)
        return original(self, ptrs, mask, other, cache_policy, is_volatile)

    create_masked_load._poisons = True
    builder.create_masked_load = create_masked_load
    return True
