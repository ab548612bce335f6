"""The house rules of the packages, read from their source with `ast` (nothing is imported):

* no import circle among the modules of minisgl/, classroom/, judge/ and tools/, counting every
  import, also the ones inside functions and the type-only ones under `if TYPE_CHECKING:`, and a
  package's __init__ as a module of its own wherever a name defined in it is imported;
* the engine (minisgl/) imports no notebook library (IPython, ipywidgets, matplotlib: those
  belong to classroom/), and none of its files is over 400 lines;
* the judge's code (judge/, less its known-wrong variants) has no file over 400 lines and no
  function over 60.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Sequence, Set

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("minisgl", "classroom", "judge", "tools")
NOTEBOOK_LIBRARIES = ("IPython", "ipywidgets", "matplotlib")
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
WORKBOOK = ("judge", "classroom", "tools")  # packages built on the engine


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(
    tree: ast.AST, module: str, is_package: bool, modules: Set[str] | None = None
) -> Set[str]:
    """Every module name `module`'s source imports (absolute, relative ones resolved), anywhere in
    it (inside functions too). `from a import b` imports module a.b where that is one of
    `modules`, else the name b of module a, so it imports a; without `modules`, both."""
    names: Set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names}
            if modules is None:
                names.add(target)
                names.update(submodules)
                continue
            names.update(submodules & modules)
            if submodules - modules:  # a name defined in `target` itself: its code runs first
                names.add(target)
    return names


def import_graph(root: Path, packages=PACKAGES) -> Dict[str, Set[str]]:
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            files[module_name(path, root)] = path
    graph: Dict[str, Set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found = imported_names(tree, module, path.name == "__init__.py", set(files))
        # A module that takes a name from its own package (`from . import check`, `import judge`
        # then `judge.check`) depends on the package's __init__, and counts; `from . import
        # settings` only imports the submodule settings, and Python running the package's
        # __init__ before any of its modules is not an import the module makes.
        graph[module] = {name for name in found if name in files and name != module}
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> List[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph(REPO))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_a_planted_circle_is_found_and_named(tmp_path):
    pkg = tmp_path / "minisgl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from minisgl.c import C\n"
    )
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    cycle = find_cycle(import_graph(tmp_path, ("minisgl",)))
    assert cycle == ["minisgl.a", "minisgl.sub.b", "minisgl.c", "minisgl.a"], cycle


def test_a_name_taken_from_the_package_inside_a_function_closes_a_circle(tmp_path):
    # judge/__init__.py's check() imports judge.live inside the function: a module under it that
    # takes a name of the package itself, even inside a function, closes a circle; one that only
    # imports a sibling module (`from . import settings`) does not.
    pkg = tmp_path / "judge"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def check():\n    from .live import check\n")
    (pkg / "settings.py").write_text("")
    (pkg / "live.py").write_text("from . import settings\n\ndef check():\n    pass\n")
    assert find_cycle(import_graph(tmp_path, ("judge",))) is None
    (pkg / "live.py").write_text("def again():\n    from judge import check\n")
    cycle = find_cycle(import_graph(tmp_path, ("judge",)))
    assert cycle == ["judge", "judge.live", "judge"], cycle


def test_the_engine_imports_no_notebook_library_and_keeps_its_files_short():
    notebook, long_files = [], []
    for path in sorted((REPO / "minisgl").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(REPO).as_posix()
        if len(text.splitlines()) > MAX_LINES:
            long_files.append(f"{rel} ({len(text.splitlines())} lines)")
        names = imported_names(ast.parse(text), module_name(path, REPO), path.name == "__init__.py")
        notebook += [
            f"{rel} imports {n}" for n in sorted(names) if n.split(".")[0] in NOTEBOOK_LIBRARIES
        ]
    assert not notebook, (
        "the engine imports a notebook library (move it to classroom/): " + "; ".join(notebook)
    )
    assert not long_files, f"files of minisgl/ over {MAX_LINES} lines: " + ", ".join(long_files)


def long_code(root: Path, skip: Sequence[str] = ()) -> List[str]:
    """The files over MAX_LINES lines and the functions over MAX_FUNCTION_LINES under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if any(part in skip for part in path.relative_to(root).parts):
            continue
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root.parent).as_posix()
        if len(text.splitlines()) > MAX_LINES:
            found.append(f"{rel} ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_judge_keeps_its_files_and_functions_short():
    found = long_code(REPO / "judge", skip=("variants",))
    assert not found, (
        f"judge/ has files over {MAX_LINES} lines or functions over {MAX_FUNCTION_LINES} "
        "(split them by moving and naming pieces): " + "; ".join(found)
    )


def test_a_long_function_is_found_and_named(tmp_path):
    pkg = tmp_path / "judge"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (pkg / "long.py").write_text(f"def long():\n{body}")
    assert long_code(pkg) == [f"judge/long.py:1 long ({MAX_FUNCTION_LINES + 1} lines)"]


def test_the_engine_imports_nothing_of_the_workbook():
    """The engine stands alone: the grader (judge/), the notebooks' helpers (classroom/) and the
    workbook's tools (tools/) build on it, never the other way (a learner's code is served by
    `python judge.py serve`, and swapped-in code finds its names through the judge)."""
    found = []
    for path in sorted((REPO / "minisgl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = imported_names(tree, module_name(path, REPO), path.name == "__init__.py")
        rel = path.relative_to(REPO).as_posix()
        found += [f"{rel} imports {n}" for n in sorted(names) if n.split(".")[0] in WORKBOOK]
    assert not found, "the engine imports the workbook: " + "; ".join(found)
