"""`python -m tools.workbook variants [chNN ...]`: every try-out is as sharp as the judge on the
known-wrong variants.

For each variant (judge/variants/chNN_<bug>.py) and each exercise it gets wrong, the solution
notebook is run up to that exercise's cell, with the variant's function in place of the reference
one and the cell's try-out after it as written. The try-out must show a ✘ line (or raise): a
variant the judge catches and the try-out passes would tell a learner "all good" and the judge
"wrong". Each line printed names the variant, the exercise and what its try-out showed.
"""

from __future__ import annotations

import ast
from typing import Iterable, List, Tuple

import nbformat

from . import execute as runner
from . import notebook
from .paths import CHAPTERS, NOTEBOOKS
from .source import chapter_files, read_chapter


def variant_functions(path, exercises) -> List[Tuple[object, str, str]]:
    """[(exercise, the variant's def of it, the variant's imports)] for the exercises it changes."""
    source = path.read_text(encoding="utf-8")
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


def variants(ids: Iterable[str] = ()) -> int:
    from classroom.tryout import FAIL
    from judge.registry import load_registry, variant_files

    registry = load_registry()
    failed = False
    wanted = set(ids)
    for ch in (read_chapter(p) for p in chapter_files(CHAPTERS)):
        if (wanted and ch.chapter not in wanted) or ch.chapter not in registry.chapters:
            continue
        reg = registry.chapter(ch.chapter)
        written = notebook.render(ch, "solution")
        index = {
            cell.metadata.get("minisgl", {}).get("exercise"): i
            for i, cell in enumerate(written.cells)
            if notebook.cell_kind(cell) == "exercise"
        }
        for path in variant_files(reg):
            for ex, variant_def, imports in variant_functions(path, reg.exercises):
                i = index.get(ex.id)
                if i is None or "check(" not in written.cells[i].source:
                    continue  # no try-out that checks: nothing to hold to the judge
                nb = nbformat.from_dict(written)
                nb.cells = nb.cells[: i + 1]
                nb.cells[i].source = with_variant(nb.cells[i].source, ex.attr, variant_def, imports)
                result = runner.run(nb, NOTEBOOKS, allow_errors=True)
                cell = result.nb.cells[i]
                text = "".join(
                    o.get("text", "")
                    for o in cell.get("outputs", [])
                    if o.get("output_type") == "stream"
                )
                raised = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
                if FAIL in text or raised:
                    print(f"ok   {path.stem} / {ex.id}: its try-out shows ✘")
                    continue
                last = text.strip().splitlines()[-1][:120] if text.strip() else "no output"
                print(f"FAIL {path.stem} / {ex.id}: judged wrong, its try-out shows no ✘: {last}")
                failed = True
    return 1 if failed else 0
