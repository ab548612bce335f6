"""An error raised inside a learner's Triton code, said in chapter 17's words.

Triton's interpreter wraps a kernel's error in an `InterpreterError` (the original as its cause)
and words it in the compiler's terms: "Cannot make_shape_compatible: incompatible dimensions at
index 1: 16 and 32", "Both operands must be same dtype. Got fp32 and bf16". Those say what the
compiler could not do, not which rule of the kernel broke. `in_chapter_words` names the `tl` call
that refused, the values it was given (read from the frames of Triton's own code, where the
message leaves them out) and the rule; where an engine kernel's math call ("Expected dtype
['fp32', 'fp64'] but got bf16") refuses what the learner's step returned, which of its returned
values it was. The try-outs (tryout.py) and the judge's failure messages
(judge/failure_messages.py) both use it, so a learner reads one wording in both places.
"""

from __future__ import annotations

import os
import re
import traceback
from types import FrameType
from typing import List, Tuple

_SHAPES = re.compile(
    r"Cannot make_shape_compatible: incompatible dimensions at index (\d+): (\d+) and (\d+)"
)
_DOT_DTYPES = re.compile(r"Both operands must be same dtype\. Got (\w+) and (\w+)")
# tl.exp, tl.log, tl.sqrt... (triton/language/math.py's _check_dtype): libdevice's float types only
_MATH_DTYPE = re.compile(r"Expected dtype \[([^\]]*)\] but got (\w+)")
# tl.store (and tl.load) of values whose shape is not the pointers' tile's
_LISTED = r"(\[(?:[^\[\]]|\[[^\]]*\])*\])"  # a list's repr, its items "constexpr[16]"
_POINTER_SHAPE = re.compile(f"Expected pointer argument to have shape {_LISTED} but got {_LISTED}")
# the running state chapter 17's kernels carry through their loop and get back from the step
_RUNNING_STATE = ("m_i", "l_i", "acc")
_TL = os.sep + os.path.join("triton", "language") + os.sep


def causes(e: BaseException | None) -> List[BaseException]:
    """`e` and the exceptions it came from, outermost first (Triton wraps a kernel's error)."""
    seen: List[BaseException] = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _frames(e: BaseException) -> List[Tuple[FrameType, int]]:
    return list(traceback.walk_tb(e.__traceback__))


def _tl_call(e: BaseException) -> str | None:
    """The `tl.` function the kernel called when `e` was raised: the outermost frame of
    triton/language/ that is not its decorator's wrapper."""
    for f, _ in _frames(e):
        if _TL in f.f_code.co_filename and f.f_code.co_name not in ("wrapper", "<lambda>"):
            return f"tl.{f.f_code.co_name}"
    return None


def _shapes(e: BaseException) -> Tuple[List[int], List[int]] | None:
    """The two shapes Triton was broadcasting together, from its broadcast's frame."""
    for f, _ in reversed(_frames(e)):
        left, right = f.f_locals.get("lhs_shape"), f.f_locals.get("rhs_shape")
        if left is not None and right is not None:
            try:
                return [int(d) for d in left], [int(d) for d in right]
            except (TypeError, ValueError):
                return None
    return None


def _math_call(e: BaseException) -> Tuple[str, str | None]:
    """The `tl.` math function that refused its operand's dtype (its dtype check's frame holds
    it as `fn`), and the kernel's line that called it."""
    frames = _frames(e)
    name = next(
        (
            getattr(f.f_locals.get("fn"), "__name__", None)
            for f, _ in reversed(frames)
            if _TL in f.f_code.co_filename and f.f_code.co_name == "check"
        ),
        None,
    )
    line = next(
        (
            f"{os.path.basename(f.f_code.co_filename)} line {n}"
            for f, n in reversed(frames)
            if _TL not in f.f_code.co_filename
            and "triton" + os.sep + "runtime" not in f.f_code.co_filename
        ),
        None,
    )
    return (f"tl.{name}" if name else "a tl math function"), line


def _state_of_dtype(e: BaseException, dtype: str) -> Tuple[List[str], str] | None:
    """Which of the running state's values (m_i, l_i, acc) the kernel that raised holds in
    `dtype`, with the kernel's name: what the learner's online_softmax_step returned."""
    for f, _ in reversed(_frames(e)):
        held = f.f_locals
        if all(n in held for n in _RUNNING_STATE):
            names = [
                n
                for n in _RUNNING_STATE
                if getattr(getattr(held[n], "dtype", None), "name", None) == dtype
            ]
            return (names, f.f_code.co_name) if names else None
    return None


def _math_dtype_words(e: BaseException, accepted: str, got: str) -> str:
    call, line = _math_call(e)
    takes = " or ".join(t.strip(" '") for t in accepted.split(","))
    state = _state_of_dtype(e, got)
    if state:
        names, kernel = state
        values = " and ".join(names)
        at = f" ({line})" if line else ""
        return (
            f"the engine's {kernel} calls {call}{at} on the running state after its loop, and "
            f"{call} takes {takes} only: it was given {got}, because online_softmax_step returned "
            f"{values} in {got}. m_i, l_i and acc come back float32 (the kernels carry them "
            f"through their loop over key blocks in float32): compute {values} in float32 and "
            "return it so, without casting it to the values' dtype"
        )
    return (
        f"{call} takes {takes} only, and was given {got}: exp, log and the other math functions "
        "compute in float32 on a GPU, so cast the operand to float32 before the call (chapter "
        "17 keeps its softmax and its running state in float32)"
    )


def _dims(listed: str) -> List[int]:
    return [int(n) for n in re.findall(r"\d+", listed)]


def _misshapen_state(e: BaseException) -> str:
    """ ", the running state (m_i, l_i, acc) the kernel got back from the learner's step, with
    its shapes" when they are not [M], [M] and [M, HEAD_DIM]; "" otherwise, or where no
    engine kernel holding that state was running."""
    for f, _ in reversed(_frames(e)):
        held = f.f_locals
        if all(n in held for n in _RUNNING_STATE):
            shapes = {}
            for n in _RUNNING_STATE:
                try:
                    shapes[n] = [int(d) for d in getattr(held[n], "shape", ())]
                except (TypeError, ValueError):
                    return ""
            m_i, l_i, acc = (shapes[n] for n in _RUNNING_STATE)
            if len(m_i) == 1 and l_i == m_i and len(acc) == 2 and acc[0] == m_i[0]:
                return ""
            return (
                f"; online_softmax_step returned m_i {m_i}, l_i {l_i}, acc {acc}, where the kernel "
                "carries m_i and l_i [M] and acc [M, HEAD_DIM] (one row a query head or token): "
                "return them in the shapes they came in"
            )
    return ""


def refused_rule(raised: BaseException) -> str | None:
    """The rule a Triton refusal in the learner's kernel broke, as a try-out's ✘ line is labelled
    (in_chapter_words gives the values); None for any other error."""
    for e in reversed(causes(raised)):
        said = str(e)
        if _SHAPES.search(said):
            if (_tl_call(e) or "") in ("tl.load", "tl.store"):
                return "a mask has the shape of the tile it guards, or one that broadcasts to it"
            return "two tiles combine element by element only where each dimension is equal or 1"
        if _POINTER_SHAPE.search(said):
            return "a store's values have the shape of its tile of pointers"
        if _MATH_DTYPE.search(said):
            return "the running state (m_i, l_i, acc) and the math functions' operands are float32"
        if _DOT_DTYPES.search(said):
            return (
                "tl.dot takes two operands of one dtype (block_dot casts the float32 "
                "probabilities to the values' dtype)"
            )
    return None


def in_chapter_words(raised: BaseException) -> str | None:
    """What Triton refused in the learner's kernel, as the rule it broke with its values; None
    when the error is none of those the chapter explains."""
    for e in reversed(causes(raised)):  # the innermost: its frames are Triton's own, at the refusal
        said = str(e)
        m = _SHAPES.search(said)
        if m:
            call = _tl_call(e) or "a tl operation"
            shapes = _shapes(e)
            index, a, b = m.groups()
            tiles = (
                f"tiles of shapes {shapes[0]} and {shapes[1]}" if shapes else "two tiles"
            ) + f" (dimension {index}: {a} against {b})"
            if call in ("tl.load", "tl.store") and shapes:
                # Triton broadcasts the pointers' tile with the mask (or other=)
                tile, guard = shapes
                fits = " or ".join(
                    str(shape) for shape in ([tile[:-1] + [1]] if len(tile) > 1 else []) + [tile]
                )
                return (
                    f"{call} was given a {tile} tile of pointers and a {guard} mask (or other=),"
                    f" which do not broadcast (dimension {index}: {a} against {b}): a mask has "
                    "the shape of the tile it guards, or one that broadcasts to it: here "
                    f"{fits} (chapter 17's [BLOCK_N, D] values, a key a row, take n_ok[:, None], "
                    "not n_ok[None, :])"
                )
            return (
                f"{call} was given {tiles}, which do not broadcast: two tiles combine element "
                "by element only where each dimension is equal or 1 (add an axis with "
                "[:, None] or [None, :] on the side it belongs to)"
            ) + _misshapen_state(e)
        m = _POINTER_SHAPE.search(said)
        if m:
            call = _tl_call(e) or "tl.store"
            values, pointers = _dims(m.group(1)), _dims(m.group(2))
            return (
                f"{call} was given values of shape {values} for a tile of pointers of shape "
                f"{pointers}: one value goes to each pointer, so the values have the pointers' "
                "shape (or one that broadcasts to it)"
            ) + _misshapen_state(e)
        m = _MATH_DTYPE.search(said)
        if m:
            return _math_dtype_words(e, m.group(1), m.group(2))
        m = _DOT_DTYPES.search(said)
        if m:
            return (
                f"tl.dot takes two operands of one dtype, and was given {m.group(1)} and "
                f"{m.group(2)}: cast one to the other's before the product, and keep the "
                "accumulator float32 (chapter 17's block_dot casts the float32 probabilities "
                "to the values' dtype)"
            )
    return None
