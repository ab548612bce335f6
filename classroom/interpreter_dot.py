"""One wrapper around Triton's interpreter's `tl.dot` for every fix that makes it behave as a GPU
does (interpreter_bf16.py, interpreter_tf32.py): each fix converts the operands, once installed."""

from __future__ import annotations

import os
from typing import Callable


def interpreter_modules():
    """(triton.language, triton.runtime.interpreter) when kernels run in Triton's interpreter
    (TRITON_INTERPRET=1, how they run on a CPU), else None: compiled kernels, or no triton, need
    none of the workbook's interpreter fixes."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return None
    return tl, interpreter


def wrap_interpreter_dot(name: str, convert: Callable) -> bool:
    """Make the interpreter's dot pass its operands through `convert(a, b, input_precision, tl,
    interpreter) -> (a, b)` first, once per `name`; whether it is (now) in place. A no-op when
    kernels are compiled (no TRITON_INTERPRET=1) or triton is not installed."""
    modules = interpreter_modules()
    if modules is None:
        return False
    tl, interpreter = modules
    builder = interpreter.InterpreterBuilder
    installed = getattr(builder.create_dot, "_fixes", frozenset())
    if name in installed:
        return True
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = convert(a, b, input_precision, tl, interpreter)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._fixes = installed | {name}
    builder.create_dot = create_dot
    return True
