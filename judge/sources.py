"""Where learner code comes from, and what can be told about it without running it.

Three sources give the same thing, a `LearnerCode` (snippets of source, each tagged with the
exercise it belongs to when that is known):

* a saved notebook: only its exercise cells (`metadata.minisgl.exercise == "chNN.name"`) and
  support cells (`metadata.minisgl.support == true`) are taken, so scratch cells are free; from
  the other cells only the imports of names those cells use come along (a set-up cell's
  `from minisgl.server.detokenizer import REPLACEMENT`), because the judge runs the cells in the
  namespace of every module their exercises go into, and a name the notebook imported need not be
  one of that module's globals;
* a plain Python file (`--file`), also the format of the known-wrong variants;
* the live definitions in a running notebook (`judge.check`, see live.py).

Only definitions are kept from exercise cells and files: top-level `def`/`class`, imports, and
assignments of literal constants. Try-out code after a def (which would call the function, or use
the notebook's other variables) is left out, so judging never depends on it.

Nothing here executes learner code; notebooks are read with `json` (the GPU machine has no
nbformat).
"""

from __future__ import annotations

import ast
import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

from .registry import Chapter, Exercise


class SourceError(Exception):
    """Learner code that cannot be read at all (missing or corrupt file); the message says why."""


@dataclass
class Snippet:
    label: str  # shown in tracebacks and reports: "ch11_overlap.ipynb cell 12"
    source: str
    exercise: str | None = (
        None  # the exercise name of an exercise cell; None for files and support cells
    )


@dataclass
class LearnerCode:
    chapter: str
    origin: str  # human-readable: "notebooks/ch11_overlap.ipynb", "solution.py", "live notebook"
    snippets: List[Snippet]
    # What happens to an exercise that the code does not define: "error" (the learner's code must
    # define every exercise) or "reference" (variants and stubs define only what they change).
    missing: str = "error"
    problems: Dict[str, str] = field(default_factory=dict)  # exercise name -> why it cannot run
    # e.g. a support cell that does not parse
    general_problems: List[str] = field(default_factory=list)
    attempted: Dict[str, bool] = field(default_factory=dict)  # exercise name -> not a stub any more
    # exercise name -> a "did you mean" for one left out
    notes: Dict[str, str] = field(default_factory=dict)

    def swaps(self, name: str) -> bool:
        """Whether exercise `name` is judged from this code (else the reference stays in place)."""
        return name in self.attempted or name in self.problems or self.missing == "error"

    def untouched(self, chapter: Chapter) -> bool:
        """Every exercise of `chapter` is still its stub, as in a fresh clone, and nothing else is
        wrong: nothing of the learner's to judge (each test would only meet a stub's
        NotImplementedError). True for a chapter without exercises."""
        return not self.general_problems and all(
            self.attempted.get(e.name) is False for e in chapter.exercises
        )

    def defined(self) -> Dict[str, ast.AST]:
        """Top-level names the snippets define (last definition wins), with their nodes."""
        out: Dict[str, ast.AST] = {}
        for snip in self.snippets:
            for node in ast.parse(snip.source).body:
                for name in _bound_names(node):
                    out[name] = node
        return out


# ---------------------------------------------------------------------- reading


def _read(path: Path, what: str) -> str:
    """The text of `path`, or a SourceError that says plainly what is wrong with it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read {what} {path}: {e}") from None


def from_file(
    path: str | Path, chapter: Chapter, *, missing: str = "error", origin: str | None = None
) -> LearnerCode:
    path = Path(path)
    text = _read(path, "file")
    code = LearnerCode(
        chapter.key, origin or str(path), [Snippet(str(path), text)], missing=missing
    )
    return analyze(code, chapter)


def find_notebook(chapter: Chapter, notebooks_dir: Path) -> Path:
    found = sorted(p for p in notebooks_dir.glob(f"{chapter.key}_*.ipynb") if p.is_file())
    if not found:
        raise SourceError(
            f"no notebook for {chapter.key}: expected {notebooks_dir}/{chapter.key}_*.ipynb "
            "(judge a file with --file, or the reference with --solution)"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise SourceError(
            f"several notebooks for {chapter.key} ({names}): pick one with --notebook"
        )
    return found[0]


def from_notebook(path: str | Path, chapter: Chapter) -> LearnerCode:
    path = Path(path)
    raw = _read(path, "notebook")
    try:
        nb = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SourceError(
            f"{path} is not a valid notebook: broken JSON at line {e.lineno}, column {e.colno} "
            "(was it saved completely? Jupyter keeps a copy in .ipynb_checkpoints/)"
        ) from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise SourceError(f"{path} is not a notebook: it has no list of cells")
    snippets = []
    imports: List[tuple] = []  # (cell number, an import statement) of the other cells
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        ours = meta.get("minisgl") if isinstance(meta.get("minisgl"), dict) else {}
        tags = meta.get("tags") if isinstance(meta.get("tags"), list) else []
        exercise = ours.get("exercise")
        if isinstance(exercise, str):
            if not exercise.startswith(chapter.key + "."):
                continue  # another chapter's exercise
            name = exercise.split(".", 1)[1]
        elif ours.get("support") is True or "support" in tags or "exercise" in tags:
            name = None  # learner-visible helpers (or an exercise cell we cannot attribute)
        else:  # scratch cells, demos, other chapters' exercises: only their imports may matter
            imports.extend((number, node) for node in _imports_of(_cell_source(cell)))
            continue
        source = _cell_source(cell)
        label = f"{path.name} cell {number}" + (f" ({chapter.key}.{name})" if name else "")
        snippets.append(Snippet(label, _strip_magics(source), name))
    code = analyze(LearnerCode(chapter.key, str(path), snippets), chapter)
    needed = _imports_needed(code, imports)
    if needed:
        numbers = ", ".join(str(n) for n in sorted({n for n, _ in needed}))
        label = f"{path.name} imports (cell {numbers})"
        source = "\n".join(line for _, line in needed) + "\n"
        code.snippets.insert(0, Snippet(label, source, None))
    return code


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return _strip_magics("".join(source) if isinstance(source, list) else str(source))


def _imports_of(source: str) -> List[ast.stmt]:
    """The top-level import statements of a cell (none if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [
        n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and not _relative(n)
    ]


def _relative(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and bool(node.level)


def _imports_needed(code: LearnerCode, imports: List[tuple]) -> List[tuple]:
    """[(cell number, one import line)] for each name the kept code reads and does not bind itself
    that another cell imports (the last such import wins, as in the kernel)."""
    used = set()
    for snip in code.snippets:
        used |= {n.id for n in ast.walk(ast.parse(snip.source)) if isinstance(n, ast.Name)}
    used -= set(code.defined())
    chosen: Dict[str, tuple] = {}
    for number, node in imports:
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            if bound not in used or alias.name == "*":
                continue
            if isinstance(node, ast.ImportFrom):
                line = f"from {node.module} import {alias.name}"
            else:
                line = f"import {alias.name}"
            if alias.asname:
                line += f" as {alias.asname}"
            chosen[bound] = (number, line)
    return list(chosen.values())


def from_sources(
    chapter: Chapter,
    sources: Dict[str | None, str],
    origin: str,
    *,
    missing: str = "error",
    missing_hint: str = "",
) -> LearnerCode:
    """From source text already in hand: {exercise name or None: source} (used by judge.check)."""
    snippets = [
        Snippet(f"<{origin}: {name or 'helpers'}>", src, name) for name, src in sources.items()
    ]
    code = analyze(LearnerCode(chapter.key, origin, snippets, missing=missing), chapter)
    for name, problem in code.problems.items():
        if problem.startswith("no `def") and missing_hint:
            code.problems[name] = problem + missing_hint
    return code


def _strip_magics(source: str) -> str:
    """IPython magics (`%time`, `%%capture`, `!ls`) are not Python: turn them into comments."""
    out = []
    for line in source.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")):
            indent = line[: len(line) - len(stripped)]
            line = f"{indent}pass  # {stripped}" if indent else f"# {stripped}"
        out.append(line)
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


# ---------------------------------------------------------------------- analysis (no execution)


def analyze(code: LearnerCode, chapter: Chapter) -> LearnerCode:
    """Parse every snippet, keep only its definitions, and note what is wrong before anything
    runs."""
    kept: List[Snippet] = []
    for snip in code.snippets:
        try:
            tree = ast.parse(snip.source, filename=snip.label)
        except SyntaxError as e:
            msg = f"syntax error in {snip.label}, line {e.lineno}: {e.msg}" + _excerpt(
                snip.source, e.lineno
            )
            if snip.exercise is not None:
                code.problems.setdefault(snip.exercise, msg)
            elif len(code.snippets) == 1:  # a whole file: nothing of it can run
                for ex in chapter.exercises:
                    code.problems.setdefault(ex.name, msg)
            else:
                code.general_problems.append(msg)
            continue
        kept.append(Snippet(snip.label, _definitions_only(snip.source, tree), snip.exercise))
    code.snippets = kept
    defined = code.defined()
    for ex in chapter.exercises:
        node = defined.get(ex.attr)
        if ex.name in code.problems:
            continue
        if node is None:
            others = chapter.exercises
            if code.missing == "error":
                code.problems[ex.name] = _missing_message(ex, defined, others)
            elif did_you_mean(ex, defined, others):  # the reference stays; was it meant?
                code.notes[ex.name] = did_you_mean(ex, defined, others)
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if code.missing == "error" or not isinstance(node, ast.Assign):
                code.problems.setdefault(
                    ex.name, f"`{ex.attr}` must be a function (`def {ex.attr}(...):`)"
                )
            continue
        code.attempted[ex.name] = not is_stub(node)
    return code


def _definitions_only(source: str, tree: ast.Module) -> str:
    """The source with top-level statements other than definitions blanked out (line numbers kept,
    so tracebacks point at the learner's real lines)."""
    lines = source.splitlines()
    for node in tree.body:
        if _is_definition(node):
            continue
        for i in range(node.lineno - 1, node.end_lineno or node.lineno):
            lines[i] = ""
    return "\n".join(lines) + "\n"


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    ):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True  # a docstring or a bare string
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        try:
            ast.literal_eval(node.value)
            return True  # EPS = 1e-6
        except ValueError:
            # `rms_norm = my_rms_norm`: aliasing a function the learner wrote
            return isinstance(node.value, ast.Name)
    return False


def _bound_names(node: ast.AST) -> Iterable[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Name):
                yield t.id
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0]


def is_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A body that is (a docstring and) only `raise NotImplementedError(...)`: not attempted yet."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    while body and isinstance(body[0], ast.Pass):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    func = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(func, ast.Name) and func.id == "NotImplementedError"


def _missing_message(
    ex: Exercise, defined: Dict[str, ast.AST], others: Sequence[Exercise] = ()
) -> str:
    msg = f"no `def {ex.attr}(...)` found"
    close = did_you_mean(ex, defined, others)
    return msg + (f" ({close})" if close else "")


def did_you_mean(
    ex: Exercise, defined: Dict[str, ast.AST], others: Sequence[Exercise] = ()
) -> str | None:
    """For an exercise the code does not define: a function of nearly its name, said as a fix.
    `others`: the chapter's exercises, whose own names are never a misspelling of this one's
    (chapter 13's `detokenize` is not a `tokenize` mistyped)."""
    taken = {o.attr for o in others if o.attr != ex.attr}
    funcs = [
        n
        for n, node in defined.items()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and n not in taken
    ]
    close = difflib.get_close_matches(ex.attr, funcs, n=1, cutoff=0.6)
    if ex.name in funcs and ex.name != ex.attr:
        close = [ex.name]
    return (
        f"there is a `def {close[0]}`: the judge needs the exact name `{ex.attr}`"
        if close
        else None
    )


def require_some_exercise(code: LearnerCode, chapter: Chapter, path: Path | str) -> None:
    """A file judged for a chapter must define at least one of its exercises (the others stay the
    reference): one that defines none is a mistake (wrong chapter, misspelt names), said plainly."""
    if code.attempted or code.problems or not chapter.exercises:
        return
    defined = code.defined()
    names = ", ".join(f"`def {ex.attr}`" for ex in chapter.exercises)
    others = chapter.exercises
    fixes = [fix for ex in others for fix in [did_you_mean(ex, defined, others)] if fix]
    raise SourceError(
        f"{path} defines none of {chapter.key}'s exercises ({names})"
        + (f": {'; '.join(fixes)}" if fixes else ": is it the right chapter?")
    )


def _excerpt(source: str, lineno: int | None) -> str:
    lines = source.splitlines()
    if lineno is None or not (1 <= lineno <= len(lines)):
        return ""
    return f": `{lines[lineno - 1].strip()[:80]}`"
