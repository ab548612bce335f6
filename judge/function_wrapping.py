"""A learner's function made to look like the reference it replaces: wrapped again as the
original was (property, classmethod, staticmethod, a `torch.no_grad()`-style decorator, a Triton
kernel jitted afresh), and the stand-in that takes the place of code that cannot run (it raises
`LearnerCodeError` with the reason). Used by swap.py in the judge's test process."""

from __future__ import annotations

import functools
import inspect


class LearnerCodeError(Exception):
    """Raised by the stand-in of an exercise whose code could not be put in place."""


def is_kernel(obj) -> bool:
    """A Triton kernel (@triton.jit: a JITFunction, or an InterpretedFunction under
    TRITON_INTERPRET=1), told without importing triton: it holds its Python function as `.fn`."""
    return type(obj).__module__.startswith("triton.") and inspect.isfunction(
        getattr(obj, "fn", None)
    )


def unwrap_kind(obj):
    if is_kernel(obj):  # the learner's function is compared, and jitted again, as plain Python
        return obj.fn
    if isinstance(obj, property):
        return obj.fget
    if isinstance(obj, (classmethod, staticmethod)):
        return obj.__func__
    return obj


def standin_for(exercise_id: str, problem: str, raw):
    message = f"{exercise_id}: {problem}"

    def standin(*args, **kwargs):
        raise LearnerCodeError(message)

    try:
        standin.__signature__ = inspect.signature(unwrap_kind(raw))  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    if is_kernel(raw):
        return KernelStandin(standin)
    return standin


class KernelStandin:
    """A kernel's stand-in: launched as `kernel[grid](...)`, it raises the stand-in's error (a
    stand-in jitted by Triton would be compiled, on a GPU, before it could raise)."""

    def __init__(self, standin):
        self.fn = standin

    def __getitem__(self, grid):
        return self.fn

    def __call__(self, *args, **kwargs):  # a kernel's helper, called from an interpreted kernel
        return self.fn(*args, **kwargs)


def rewrap(raw, fn):
    """Re-apply the original's kind, and a torch grad-mode decorator (@torch.no_grad()) if it had
    one. A Triton kernel's kind is @triton.jit: the learner's function is jitted afresh, with or
    without their own decorator, so that what the launches compile (and Triton caches, by source)
    is the learner's code."""
    if is_kernel(raw):
        return fn if isinstance(fn, KernelStandin) else _jit(fn)
    inner = unwrap_kind(raw)
    factory = None
    if getattr(inner, "__wrapped__", None) is not None:
        try:
            factory = inspect.getclosurevars(inner).nonlocals.get("ctx_factory")
        except (TypeError, ValueError):
            factory = None
    if callable(factory) and getattr(fn, "__wrapped__", None) is None:
        learner = fn

        @functools.wraps(learner)
        def fn(*args, **kwargs):
            with factory():
                return learner(*args, **kwargs)

    if isinstance(raw, property):
        return property(fn, raw.fset, raw.fdel, raw.__doc__)
    if isinstance(raw, classmethod):
        return classmethod(fn)
    if isinstance(raw, staticmethod):
        return staticmethod(fn)
    return fn


def _jit(fn):
    """`fn` jitted as a kernel's helper. A kernel resolves its helpers' names when it runs (Triton's
    interpreter) or when it is first compiled (GPU), both after the swap, so the learner's is the
    one used, and the compiled kernel's cache key hashes the helper's source. An unwritten stub
    cannot be compiled (Triton has no `raise`): jitted for a GPU, its stub's NotImplementedError
    is raised when a kernel that calls it is compiled, so its tests fail as "not written yet"."""
    import triton

    jitted = triton.jit(fn)
    message = _stub_message(fn)
    if message is not None and hasattr(type(jitted), "cache_key"):  # compiled, not interpreted

        class Unwritten(type(jitted)):
            @property
            def cache_key(self):
                raise NotImplementedError(message)

        jitted.__class__ = Unwritten
    return jitted


def _stub_message(fn) -> str | None:
    """The sentinel message when `fn`'s body (past its docstring) is only the stub's
    `raise NotImplementedError("chNN.<name>: ...")`, else None."""
    import ast
    import textwrap

    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return None
    call = body[0].exc
    if not (
        isinstance(call, ast.Call)
        and getattr(call.func, "id", None) == "NotImplementedError"
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    ):
        return None
    return call.args[0].value
