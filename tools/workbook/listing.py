"""Real code for `{listing}`: the source of one definition, read from the repository's files.

`minisgl.scheduler.scheduler:Scheduler.run_forever` names a definition by module and qualified
name; `tests/test_ch11_overlap.py::check_abort_while_prefill_in_flight` names one by file. The
source is read with `ast` (nothing is imported), decorators and comments included, dedented.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

from .paths import REPO


class ListingError(ValueError):
    pass


@dataclass(frozen=True)
class Code:
    path: str  # relative to the repository root, with forward slashes
    qualname: str
    source: str


def resolve(target: str) -> Code:
    if "::" in target:
        rel, qualname = target.split("::", 1)
        path = REPO / rel
    elif ":" in target:
        module, qualname = target.split(":", 1)
        path = module_file(module)
    else:
        raise ListingError(f"{target!r}: write package.module:Qualified.name or path/file.py::name")
    if not path.is_file():
        raise ListingError(
            f"{target!r}: no file {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
        )
    text = path.read_text(encoding="utf-8")
    node = find_definition(ast.parse(text), qualname)
    if node is None:
        raise ListingError(f"{target!r}: {qualname} is not defined in {path.relative_to(REPO)}")
    return Code(path.relative_to(REPO).as_posix(), qualname, definition_source(text, node))


def module_file(module: str) -> Path:
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise ListingError(f"module {module} is not a file of this repository")


def find_definition(tree: ast.Module, qualname: str) -> ast.AST | None:
    scope: list = tree.body
    node = None
    for part in qualname.split("."):
        # the last one wins, as at run time
        node = next((n for n in reversed(scope) if _defines(n, part)), None)
        if node is None:
            return None
        scope = getattr(node, "body", [])
    return node


def _defines(node: ast.AST, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def definition_source(text: str, node: ast.AST) -> str:
    lines = text.splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    # Comment lines right above a definition belong to it.
    while first > 1 and lines[first - 2].strip().startswith("#"):
        first -= 1
    return textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno])).rstrip() + "\n"
