"""Stubs and reference code of the exercises, cut out of the reference engine's source.

The public API (the notebook generator uses it; it imports neither torch nor the engine, it reads
the source files):

    load_registry() -> Registry                      the parsed judge/exercises.toml
    exercises(chapter) -> list[Exercise]             a chapter's exercises ('ch09', 'ch9', '9' or 9)
    stub_source(chapter, exercise) -> str            what the learner starts from
    reference_source(chapter, exercise) -> str       the reference, as the learner would write it

Both sources are top-level functions named like the target's attribute (`def complete_one(self):`),
without `@property` / `@classmethod` / `@staticmethod`: the judge re-applies the target's kind when
it swaps a function in. A stub keeps the reference's signature (as written, annotations included),
docstring and `@triton.jit` (a kernel's helper); its body is one
`raise NotImplementedError("chNN.<name>: <what to implement>")`, the sentinel by which the judge
tells "not written yet" from "wrong".
"""

from __future__ import annotations

import ast
import io
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import List, Tuple

from .registry import REPO, Exercise, load_registry

__all__ = ["load_registry", "exercises", "stub_source", "reference_source", "sentinel_message"]

KIND_DECORATORS = {"property", "classmethod", "staticmethod"}
JIT_DECORATORS = {"triton.jit", "jit"}
# marks only the engine's own kernels carry: a learner's kernel is never started early
# (minisgl/kernel/triton_pdl.py), so the reference as the learner would write it has none
ENGINE_DECORATORS = {"pdl_aware"}


def exercises(chapter: str | int) -> List[Exercise]:
    return list(load_registry().chapter(chapter).exercises)


def _exercise(chapter: str | int, exercise: str | Exercise) -> Exercise:
    if isinstance(exercise, Exercise):
        return exercise
    return load_registry().chapter(chapter).exercise(exercise)


def stub_source(chapter: str | int, exercise: str | Exercise) -> str:
    ex = _exercise(chapter, exercise)
    header, doc, decorators, body_indent = _function_parts(ex)
    # a Triton kernel's helper keeps its @triton.jit: only a jitted function runs inside a kernel
    lines = [d for d in decorators if d.strip().lstrip("@") in JIT_DECORATORS] + [header]
    if doc:
        lines.append(doc)
    lines.append(f"{body_indent}raise NotImplementedError({sentinel_message(ex)!r})")
    return "\n".join(lines) + "\n"


def reference_source(chapter: str | int, exercise: str | Exercise) -> str:
    ex = _exercise(chapter, exercise)
    text, node = _function_source(ex)
    lines = text.splitlines()
    # Drop the kind decorators (the learner's format has none) and the engine's marks; keep
    # others, e.g. @torch.no_grad().
    keep = [
        ln
        for ln, dec in _decorator_lines(node, lines)
        if _decorator_name(dec) not in KIND_DECORATORS | ENGINE_DECORATORS
    ]
    start = node.lineno - 1  # the `def` line (ast numbers the def, not its decorators, in 3.8+)
    return "\n".join(keep + lines[start:]) + "\n"


def sentinel_message(ex: Exercise) -> str:
    """'chNN.<name>: <one line saying what to implement>'; the judge recognizes the prefix."""
    doc = _docstring(ex)
    what = (
        ex.todo
        or _first_sentence(doc)
        or f"write {ex.qualname}" + (" (see its docstring)" if doc else "")
    )
    return f"{ex.id}: {what}"


# ---------------------------------------------------------------------- reading the reference


def module_file(module: str) -> Path:
    """The source file of `module`, found without importing it (importing minisgl pulls in
    torch)."""
    rel = Path(*module.split("."))
    for base in [REPO, *map(Path, filter(None, sys.path))]:
        for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(f"cannot find the source of module {module}")


def _function_source(ex: Exercise) -> Tuple[str, ast.FunctionDef]:
    """The target's source, dedented to top level (decorators included), and its parsed node."""
    src = module_file(ex.module).read_text(encoding="utf-8")
    node = _find(ast.parse(src), ex.qualname.split("."), ex)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    text = textwrap.dedent("\n".join(src.splitlines()[first - 1 : node.end_lineno]))
    tree = ast.parse(text)
    return text, tree.body[0]  # type: ignore[return-value]


def _find(tree: ast.AST, path: List[str], ex: Exercise) -> ast.FunctionDef:
    body = tree.body  # type: ignore[attr-defined]
    for i, part in enumerate(path):
        last = i == len(path) - 1
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        found = [n for n in body if isinstance(n, kinds) and n.name == part]
        if not found:
            raise LookupError(f"{ex.id}: {ex.target} not found in {ex.module}")
        node = found[-1]  # a later definition wins, as at run time
        body = node.body
    return node  # type: ignore[return-value]


def _decorator_lines(node: ast.FunctionDef, lines: List[str]):
    for dec in node.decorator_list:
        yield "\n".join(lines[dec.lineno - 1 : dec.end_lineno]), dec


def _decorator_name(dec: ast.expr) -> str:
    target = dec.func if isinstance(dec, ast.Call) else dec
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _function_parts(ex: Exercise) -> Tuple[str, str, List[str], str]:
    """(header 'def f(...) -> T:' as written, docstring lines as written or '', decorators, body
    indent)."""
    text, node = _function_source(ex)
    lines = text.splitlines()
    def_text = "\n".join(lines[node.lineno - 1 :])
    header = _header(def_text)
    first = node.body[0]
    body_indent = " " * (first.col_offset if first.lineno > node.lineno else 4)
    doc = ""
    if ast.get_docstring(node, clean=False) is not None and first.lineno > node.lineno:
        doc = "\n".join(lines[first.lineno - 1 : first.end_lineno])
    elif ast.get_docstring(node, clean=False) is not None:  # `def f(): """doc"""` on one line
        doc = body_indent + repr(ast.get_docstring(node))
    decorators = [d for d, _ in _decorator_lines(node, lines)]
    return header, doc, decorators, body_indent


def _header(def_text: str) -> str:
    """The `def ...:` header of a function's source, up to the colon that opens its body."""
    depth = 0
    tokens = tokenize.generate_tokens(io.StringIO(def_text).readline)
    for tok in tokens:
        if tok.type == tokenize.OP:
            if tok.string in "([{":
                depth += 1
            elif tok.string in ")]}":
                depth -= 1
            elif tok.string == ":" and depth == 0:
                row, col = tok.end
                lines = def_text.splitlines()
                return "\n".join(lines[: row - 1] + [lines[row - 1][:col]])
    raise ValueError("no function header found")


def _docstring(ex: Exercise) -> str:
    _, node = _function_source(ex)
    return ast.get_docstring(node) or ""


def _first_sentence(doc: str) -> str:
    """The docstring's first sentence on one line, if it is short enough for a one-line message."""
    text = " ".join(doc.split())
    if ". " in text:
        text = text[: text.index(". ")]
    text = text.rstrip(".")
    return text if len(text) <= 90 else ""
