"""An error raised inside a learner's Triton code, said in chapter 17's words.

Triton's interpreter wraps a kernel's error in an `InterpreterError` (the original as its cause)
and words it in the compiler's terms: "Cannot make_shape_compatible: incompatible dimensions at
index 1: 16 and 32", "Both operands must be same dtype. Got fp32 and bf16". Those say what the
compiler could not do, not which rule of the kernel broke. `in_chapter_words` names the `tl` call
that refused, the values it was given (read from the frames of Triton's own code, where the
message leaves them out) and the rule. The try-outs (tryout.py) and the judge's failure messages
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
            )
        m = _DOT_DTYPES.search(said)
        if m:
            return (
                f"tl.dot takes two operands of one dtype, and was given {m.group(1)} and "
                f"{m.group(2)}: cast one to the other's before the product, and keep the "
                "accumulator float32 (chapter 17's block_dot casts the float32 probabilities "
                "to the values' dtype)"
            )
    return None
