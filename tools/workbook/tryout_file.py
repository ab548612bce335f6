"""`python -m tools.workbook.tryout_file NOTEBOOK FILE FUNCTION`: one exercise's try-out run on a
file's answer, as a Jupyter kernel runs it, without starting one.

A trial of the book (a learner's answers kept as files) needs the try-out's lines for each file.
Running the cell with `exec` is not what a kernel does: IPython compiles every cell under a file
name of its own and keeps its source in `linecache`, which is how a try-out that raises finds the
rule it was checking and the learner's line (classroom/tryout.py). This runs, in IPython's own
shell: the notebook's first code cell, the file (its imports and functions, as a cell), then the
exercise's cell with the file's function in place of the stub (the cell's try-out as written).
"""

from __future__ import annotations

import ast
import sys

import nbformat

from .variants import with_variant


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    notebook, path, name = argv
    from IPython.core.interactiveshell import InteractiveShell

    cells = [c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    mine = next((n for n in defs if n.name == name), None)
    if mine is None:
        print(f"{path} defines no function {name!r}", file=sys.stderr)
        return 2
    lines = source.splitlines()
    start = min([mine.lineno] + [d.lineno for d in mine.decorator_list]) - 1
    mine_def = "\n".join(lines[start : mine.end_lineno])
    imports = "\n".join(
        ast.get_source_segment(source, n)
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
    )
    cell = next(
        (c for c in cells if f"def {name}(" in c and "with attempt(" in c and c is not cells[0]),
        None,
    )
    if cell is None:
        print(f"{notebook} has no exercise cell with a try-out for {name!r}", file=sys.stderr)
        return 2
    shell = InteractiveShell.instance()
    for step in (cells[0], source, with_variant(cell, name, mine_def, imports)):
        result = shell.run_cell(step)
        if not result.success:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
