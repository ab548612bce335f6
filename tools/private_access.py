"""Find code that reaches into another package's private names (`_name`).

A name with a leading underscore is a package's own business: another package that imports it or
reads it as an attribute ties itself to code that may change without notice. This walks the source
with `ast` (nothing is imported) and reports each such use:

    python -m tools.private_access            # minisgl/, judge/, tools/; exit 1 if any is found

A *package* is a directory of modules (`minisgl/scheduler`, `judge`, `tools/workbook`); a module's
own package is its directory. Which package a private name belongs to is known from where it is
defined: a top-level `def`/`class`/assignment, a method, or an attribute assigned as `self._x =
...`. A use counts as crossing when the name is defined in some scanned package but not in the
user's own (so `torch._C` or `sys._getframe` are not ours to judge, and `self._x` inside the package
that defines `_x` is fine). `from pkg.mod import _x` and `mod._x` where `mod` is an imported module
of another package are always crossings.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Set

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("minisgl", "judge", "tools")
# Known-wrong variants are method bodies that the judge swaps into the engine's classes: they run as
# the engine's own code, so its private names are theirs to use.
SKIP = ("judge/variants",)


@dataclass(frozen=True)
class Crossing:
    path: str  # relative to the scanned root
    line: int
    name: str
    owner: str  # the package the name belongs to

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name} belongs to {self.owner}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).parent.parts)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _defined_private_names(tree: ast.AST) -> Set[str]:
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)  # dataclass(..., _x=...) / namedtuple fields set by keyword
    return {n for n in names if _is_private(n)}


def _imported_modules(tree: ast.AST, own_module: str) -> Dict[str, str]:
    """Local name -> full module name, for `import a.b as m` and `from a import b` (b a module or
    not)."""
    bound: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, own_module)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
    return bound


def _resolve_from(node: ast.ImportFrom, own_module: str) -> str:
    if not node.level:
        return node.module or ""
    # own_module names a module (a package's as "pkg.__init__"): level 1 is its package
    base = own_module.split(".")[: -node.level] if own_module else []
    return ".".join(base + ([node.module] if node.module else []))


def scan(
    root: Path = REPO, tops: Iterable[str] = ROOTS, skip: Iterable[str] = SKIP
) -> List[Crossing]:
    skipped = [root / s for s in skip]
    files = sorted(
        p
        for top in tops
        for p in (root / top).rglob("*.py")
        if not any(p.is_relative_to(s) for s in skipped)
    )
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    owned: Dict[str, Set[str]] = {}  # package -> private names defined in it
    modules: Dict[str, str] = {}  # module name -> its package
    for path, tree in trees.items():
        pkg = _package_of(path, root)
        owned.setdefault(pkg, set()).update(_defined_private_names(tree))
        modules[_module_name(path, root)] = pkg
    everyone = set().union(*owned.values()) if owned else set()
    found: List[Crossing] = []
    for path, tree in trees.items():
        pkg, rel = _package_of(path, root), str(path.relative_to(root))
        own_module = _module_name(path, root)
        own_module = own_module if path.name != "__init__.py" else own_module + ".__init__"
        imported = _imported_modules(tree, own_module)

        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve_from(node, own_module)
                owner = modules.get(base)
                for alias in node.names:
                    if _is_private(alias.name) and owner is not None and owner != pkg:
                        found.append(Crossing(rel, node.lineno, alias.name, owner))
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in imported:
                    owner = modules.get(imported[node.value.id])
                    if owner is not None:
                        if owner != pkg:
                            found.append(Crossing(rel, node.lineno, node.attr, owner))
                        continue
                if node.attr in everyone and node.attr not in owned[pkg]:
                    owners = sorted(p for p, names in owned.items() if node.attr in names)
                    found.append(
                        Crossing(rel, node.lineno, node.attr, " or ".join(p or "." for p in owners))
                    )
    return found


def main() -> int:
    found = scan()
    for crossing in found:
        print(crossing)
    print(f"{len(found)} use(s) of another package's private names")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
