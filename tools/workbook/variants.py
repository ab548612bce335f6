"""The known-wrong variants (judge/variants/chNN_<bug>.diff or .py) as exercise cells: the variant's
function in place of the reference one, the cell's try-out after it as written (learner_run.py runs
them)."""

from __future__ import annotations

import ast
from typing import List, Tuple


def variant_functions(path, exercises) -> List[Tuple[object, str, str]]:
    """[(exercise, the variant's def of it, the variant's imports)] for the exercises it changes."""
    from judge.variant_edits import variant_source

    source = variant_source(path)  # an edit is applied to the current reference
    tree = ast.parse(source)
    lines = source.splitlines()
    imports = "\n".join(
        ast.get_source_segment(source, n)
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
    )
    by_attr = {ex.attr: ex for ex in exercises}
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in by_attr:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            out.append((by_attr[node.name], "\n".join(lines[start : node.end_lineno]), imports))
    return out


def with_variant(cell_source: str, attr: str, variant_def: str, imports: str) -> str:
    """The exercise cell with its function replaced by the variant's, the try-out kept."""
    tree = ast.parse(cell_source)
    lines = cell_source.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            kept = lines[:start] + [imports, "", variant_def] + lines[node.end_lineno :]
            return "\n".join(kept) + "\n"
    raise LookupError(f"the exercise cell defines no `{attr}`")
