"""`judge.check("chNN")` in a notebook's last cell: judge the definitions live in the kernel,
without saving the notebook.

The source of each exercise function is taken with `inspect.getsource` (IPython keeps every cell's
source, so this works for functions defined in cells), together with the learner's own helpers the
functions use (functions and classes defined in the notebook, modules they name, literal constants).
The judging itself happens in a fresh subprocess, exactly as `python judge.py` does: the kernel
never imports the engine for it and none of the learner's objects are touched.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any, Dict, List, Set

from .registry import Chapter, MissingPackage, check_requirements, load_registry
from .sources import from_sources


def check(
    chapter: str,
    namespace: Dict[str, Any] | None = None,
    device: str = "cpu",
    timeout: float | None = None,
    time_limit: float | None = None,
    hint: int = 0,
    verbose: bool = False,
    _depth: int = 1,
):
    """Judge `chapter` against the functions defined in `namespace` (default: the caller's globals,
    i.e. the notebook's). Shows the report and returns the verdict. The time limits default as for
    `python judge.py` (runner.RunOptions)."""
    from . import notebook_report, progress, report
    from .judging import judge
    from .runner import RunOptions, default_jobs

    if namespace is None:
        frame = sys._getframe(_depth)
        namespace = frame.f_globals
    registry = load_registry()
    target = registry.chapter(chapter)
    try:
        check_requirements([target])
    except MissingPackage as e:  # one line, not a traceback: the fix is an install
        print(f"judge: {e}")
        return None
    sources = collect_sources(target, namespace)
    code = from_sources(
        target,
        sources,
        origin="live notebook",
        missing_hint=" in the kernel (run the exercise's cell first)",
    )
    if target.exercises and code.untouched(target):
        return _not_started(target, code, device, hint)
    options = RunOptions(
        device=device, test_timeout=timeout, time_limit=time_limit, jobs=default_jobs(device)
    )

    def run():
        verdict = judge(
            [target], {target.key: code}, options, mode="learner", origin="the live notebook"
        )
        # the notebook's standing, as a saved run's
        progress.record(verdict, [target], {target.key: code})
        return verdict

    def render(verdict, console) -> None:
        report.render(
            verdict,
            [target],
            console,
            hint_level=hint,
            verbose=verbose,
            hint_command=f'judge.check("{target.key}", hint=1)',
        )

    verdict = notebook_report.shown(_running_line(target, device), run, render)
    return _Shown(verdict)


def _not_started(target: Chapter, code, device: str, hint: int):
    """Every exercise still its stub, as the notebook opens: say what to do next and run nothing
    (as `python judge.py` does), instead of minutes of tests that each meet a NotImplementedError
    (chapter 14's servers wait out their timeouts on the stubs). Hints, if asked, below."""
    from . import hints_report, notebook_report, progress, report
    from .judging import not_attempted

    verdict = not_attempted([target], "the live notebook", device)
    progress.record(verdict, [target], {target.key: code})

    def render(v, console) -> None:
        hint_command = f'judge.check("{target.key}", hint=1)'
        report.render_not_started(v, [target], console, hint_command, in_kernel=True)
        if hint:
            status = {e.id: e.status for e in v.exercises}
            hints_report.render_hints(
                hints_report.hinted([target], status), console, hint, in_notebook=True
            )

    return _Shown(notebook_report.shown(f"judging {target.key}", lambda: verdict, render))


def _running_line(chapter: Chapter, device: str) -> str:
    """ "judging ch11: running its 23 tests on cpu" (the count from the budgets file, when it
    knows)."""
    from . import budgets

    names = {f.name for f in chapter.test_files}
    times = budgets.load().get("times", {}).get(budgets.device_key(device), {})
    n = sum(key.partition("::")[0] in names for key in times)
    tests = f"its {n} tests" if n else "its tests"
    return f"judging {chapter.key}: running {tests} on {device}"


class _Shown:
    """The verdict, with a one-line repr so the cell's output is the report, not a dump."""

    def __init__(self, verdict) -> None:
        self.verdict = verdict
        self.passed = verdict.passed

    def _ipython_display_(self) -> None:
        """Shown as the last value of a cell: nothing more (the report above says it all)."""

    def __repr__(self) -> str:
        n = len(self.verdict.tests)
        ok = sum(t.ok for t in self.verdict.tests)
        return f"<judge: {'passed' if self.passed else 'not passed'}, {ok}/{n} tests>"


def collect_sources(chapter: Chapter, namespace: Dict[str, Any]) -> Dict[str | None, str]:
    """{exercise name: its source, None: the helpers they use}. Exercises not defined are left out
    (the judge then reports them as missing)."""
    out: Dict[str | None, str] = {}
    seen: Set[int] = set()
    helpers: List[str] = []
    home = namespace.get("__name__", "__main__")  # where the learner's own functions live
    for ex in chapter.exercises:
        fn = _function_of(namespace.get(ex.attr))
        if fn is None or fn.__module__ != home:
            continue  # not defined here (e.g. minisgl's own, imported): reported as missing
        src = _source(fn)
        if src is None:
            out[ex.name] = (
                f"{ex.attr} = None  # the judge could not read the source of `{ex.attr}`\n"
            )
            continue
        seen.add(id(fn))
        out[ex.name] = src
        _helpers(inspect.unwrap(fn), namespace, home, seen, helpers, _decorator_names(src))
    if not helpers:
        return out
    # imports first, then the definitions
    helpers.sort(key=lambda h: not h.startswith(("import ", "from ")))
    return {None: "\n\n".join(helpers) + "\n", **out}  # helpers load before what uses them


def _function_of(obj: Any):
    if isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    return obj if isinstance(obj, types.FunctionType) else None


def _source(obj: Any) -> str | None:
    try:
        import textwrap

        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return None


def _helpers(
    fn: types.FunctionType,
    namespace: Dict[str, Any],
    home: str,
    seen: Set[int],
    out: List[str],
    extra: Set[str] = frozenset(),
) -> None:
    """Add the notebook-defined functions, classes and constants `fn` refers to (transitively)."""
    for name in sorted(_global_names(fn.__code__) | set(extra)):
        value = namespace.get(name)
        if value is None or id(value) in seen:
            continue
        if isinstance(value, types.ModuleType):  # `import math as m` in some cell
            seen.add(id(value))
            real = value.__name__
            out.append(f"import {real}" if real == name else f"import {real} as {name}")
            continue
        if (
            isinstance(value, (int, float, str, bool, tuple))
            and not isinstance(value, type)
            and _literal(value)
        ):
            seen.add(id(value))
            out.append(f"{name} = {value!r}")
            continue
        inner = _function_of(value) or value
        if not isinstance(inner, (types.FunctionType, type)):
            continue
        if getattr(inner, "__module__", None) != home:
            # Imported from a library or from minisgl: carried as that import, because the code
            # runs in every target module's namespace, and one may lack the name.
            line = _import_line(inner, name)
            if line:
                seen.add(id(value))
                out.append(line)
            continue
        src = _source(inner)
        if src is None:
            continue
        seen.add(id(value))
        out.append(src)
        if isinstance(inner, types.FunctionType):
            _helpers(inspect.unwrap(inner), namespace, home, seen, out, _decorator_names(src))


def _import_line(obj: Any, name: str) -> str | None:
    """`from module import Name [as name]` when that import gives back `obj`, else None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or not qualname or "." in qualname or "<" in qualname:
        return None
    if getattr(sys.modules.get(module), qualname, None) is not obj:
        return None
    return f"from {module} import {qualname}" + (f" as {name}" if name != qualname else "")


def _decorator_names(source: str) -> Set[str]:
    """Names used by the decorators of a function's source (`@my_cache` must come along too)."""
    import ast

    try:
        node = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return set()
    return {
        n.id
        for d in getattr(node, "decorator_list", [])
        for n in ast.walk(d)
        if isinstance(n, ast.Name)
    }


def _global_names(code: types.CodeType) -> Set[str]:
    """The global names `code` reads. Not `co_names`: it holds attribute names too, and a notebook
    helper that happens to share one (`wait_stream`) must not be carried along."""
    import dis

    names = {
        i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")
    }
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _literal(value: Any) -> bool:
    import ast

    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        return False
