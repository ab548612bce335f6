"""The names a learner's code finds beside its target module's own: those of the modules next to it.

A learner's method runs in a copy of its target module's globals (swap.py). A right answer may name
a class the reference method does not: `isinstance(req, ChunkedReq)` in lifecycle.py is as right as
`req.is_chunk`, though lifecycle.py has no use for ChunkedReq. The engine should not import names
it does not use only so that such code resolves; the judge adds them instead: every public name
that a loaded module of the same package holds at top level (what it defines or imports), unless
the target module has that name already, or two neighbours hold different objects under it (which
one the learner meant cannot be known, so neither is given).
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any, Dict, Iterable


def neighbour_names(module: ModuleType, keep_out: Iterable[str] = ()) -> Dict[str, Any]:
    """Public top-level names of `module`'s loaded sibling modules that `module` lacks.

    `keep_out`: names never given (the exercises' own names: a neighbour's object under an
    exercise's name would look like a definition of the learner's)."""
    package = module.__name__.rpartition(".")[0]
    if not package:
        return {}
    own, excluded = vars(module), set(keep_out)
    found: Dict[str, Any] = {}
    clashes = set()
    for name in sorted(sys.modules):
        other = sys.modules[name]
        if other is None or other is module or name.rpartition(".")[0] != package:
            continue
        for key, value in vars(other).items():
            if key.startswith("_") or key in own or key in excluded or inspect.ismodule(value):
                continue
            if found.setdefault(key, value) is not value:
                clashes.add(key)
    return {key: value for key, value in found.items() if key not in clashes}
