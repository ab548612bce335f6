"""Masked `tl.load`s that leave the masked-off lanes without a value, found in a kernel's source.

On a CPU the workbook's interpreter fills such lanes with NaN (interpreter_masked_load.py), so a
kernel that uses them fails there. Compiled for a GPU they are undefined: often zeros, sometimes a
NaN or an infinity left by an earlier tile, so the same mistake passes on one GPU and run and
spoils a row on another. No run can show what a compiler leaves undefined, so on a GPU this reads
the source: a masked load needs `other=`, or its value must go through a `tl.where` before use
(the two ways the chapter allows).
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from typing import List


def loads_without_other(fn) -> List[str]:
    """One line per masked `tl.load` in `fn` (a triton.jit function or a plain one) that gives the
    masked-off lanes no value and whose result no `tl.where` touches: its line and source text."""
    src = getattr(fn, "src", None) or inspect.getsource(getattr(fn, "fn", fn))
    tree = ast.parse(textwrap.dedent(src))
    nodes = list(ast.walk(tree))
    wheres = [n for n in nodes if _is_tl_call(n, "where")]
    # names a tl.where reads: a load assigned to one of them may leave its lanes to the where
    replaced = {
        n.id for w in wheres for a in w.args for n in ast.walk(a) if isinstance(n, ast.Name)
    }
    inside_where = {id(n) for w in wheres for n in ast.walk(w)}
    assigned_to = {
        id(a.value): {t.id for t in a.targets if isinstance(t, ast.Name)}
        for a in nodes
        if isinstance(a, ast.Assign)
    }
    found = []
    for call in nodes:
        if not _is_tl_call(call, "load") or not _masked_without_other(call):
            continue
        names = assigned_to.get(id(call), set())
        if id(call) in inside_where or (names and names <= replaced):
            continue
        found.append(f"{_where(fn, call.lineno)}: {ast.unparse(call)}")
    return found


def _is_tl_call(node, attr: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "tl"
    )


def _masked_without_other(call: ast.Call) -> bool:
    # tl.load(pointer, mask=None, other=None, ...): by position or by name
    words = {k.arg for k in call.keywords}
    masked = len(call.args) >= 2 or "mask" in words
    given = len(call.args) >= 3 or "other" in words
    return masked and not given


def _where(fn, lineno: int) -> str:
    """The load's place in the learner's terms, as the try-outs' other lines give it: "your
    online_softmax_step, line 14", with the file where it is one the learner named (a notebook
    cell's file is IPython's temporary one, whose name means nothing to them)."""
    inner = getattr(fn, "fn", fn)
    name = getattr(inner, "__name__", "kernel")
    code = getattr(inner, "__code__", None)
    if code is None:
        return f"your {name}, line {lineno} of its source"
    place = f"your {name}, line {code.co_firstlineno + lineno - 1}"
    filename = code.co_filename
    if filename.startswith("<") or "ipykernel_" in filename:
        return place
    return f"{place} of {os.path.basename(filename)}"
