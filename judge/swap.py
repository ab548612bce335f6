"""Putting the learner's functions into the reference engine. Runs only in the judge's pytest
subprocess (see plugin.py), never in the parent process or a learner's kernel.

For each target module, the learner's snippets are executed in a namespace that starts as a copy of
that module's globals, so the reference module's imports and names are there for the learner's
code, with its package neighbours' public names where the module has none (neighbours.py). The
function of the target's name is then taken from that namespace and installed:

* a method (`Class.name`): set on the class, wrapped as the original was (property, classmethod,
  staticmethod; a `torch.no_grad()`-style decorator is re-applied); a `@triton.jit` helper of a
  kernel is jitted again, whether or not the learner's code jitted it;
* a module-level function: replaced in every loaded module of the target's package, in the test
  modules and in the learners' namespaces, wherever the original object is held. Modules imported
  later get the learner's version from the module they import it from.

An exercise whose code cannot run (syntax error, missing, wrong signature, raised while loading) is
replaced by a stand-in that raises `LearnerCodeError` with the reason, so its tests fail saying why
and the other exercises are still judged.

Note: the namespace is a *copy*: a module global that the engine rebinds after the copy was made is
not seen by the learner's function. No exercise of minisgl reads such a global.
"""

from __future__ import annotations
import __future__

import builtins
import importlib
import inspect
import linecache
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Set

from .function_wrapping import rewrap, standin_for, unwrap_kind
from .neighbours import neighbour_names
from .protocol import ExerciseSpec, SnippetSpec, UnitSpec

# stubs' annotations may name TYPE_CHECKING-only types
ANNOTATIONS_FLAG = __future__.annotations.compiler_flag


@dataclass
class SwapReport:
    # exercise id -> why its code is not in place
    problems: Dict[str, str] = field(default_factory=dict)
    general: List[str] = field(default_factory=list)


@dataclass
class SwapState:
    """What a swap did, kept (in the test process) so that modules loaded later can be rescanned."""

    report: SwapReport = field(default_factory=SwapReport)
    # id(original module-level function) -> replacement
    replacements: Dict[int, Any] = field(default_factory=dict)
    # keep the originals alive so their ids stay unique
    originals: Dict[int, Any] = field(default_factory=dict)
    namespaces: List[Dict[str, Any]] = field(default_factory=list)  # the learners' namespaces
    # (target module, the learner's namespace made from it), to bind exercises across modules
    homes: List[tuple] = field(default_factory=list)
    packages: Set[str] = field(default_factory=set)  # the targets' top-level packages


def apply(units: List[UnitSpec], test_dirs: List[str] | None = None) -> SwapState:
    state = SwapState()
    for unit in units:
        _apply_unit(unit, state)
    _bind_across_modules(units, state)
    if state.replacements:
        _replace_everywhere(state, test_dirs or [])
    return state


def rescan(state: SwapState, test_dirs: List[str]) -> None:
    """Replace module-level originals in modules loaded since the swap (e.g. test modules)."""
    if state.replacements:
        _replace_everywhere(state, test_dirs)


# ---------------------------------------------------------------------- one chapter's code


def _apply_unit(unit: UnitSpec, state: SwapState) -> None:
    report = state.report
    by_module: Dict[str, List[ExerciseSpec]] = {}
    for ex in unit.exercises:
        if ex.swap:
            by_module.setdefault(ex.module, []).append(ex)
    for module_name, exs in by_module.items():
        state.packages.add(module_name.split(".")[0])
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # the engine itself is broken: nothing to judge against
            for ex in exs:
                report.problems[ex.id] = (
                    f"cannot import the reference module {module_name}: {_one_line(e)}"
                )
            continue
        problems = {ex.name: ex.problem for ex in exs if ex.problem}
        namespace = _run_snippets(module, unit.snippets, exs, problems, report)
        state.namespaces.append(namespace)
        state.homes.append((module_name, namespace))
        for ex in exs:
            problem = problems.get(ex.name)
            try:
                owner, attr, raw = _resolve(module, ex.target)
            except AttributeError as e:
                report.problems[ex.id] = f"the registry's target {ex.target} does not exist: {e}"
                continue
            fn = None
            if problem is None:
                fn, problem = _learner_function(namespace, module, attr, raw, unit.missing)
                if fn is None and problem is None:
                    continue  # not defined, and the reference stays (variants, stubs)
            if problem is not None:
                report.problems[ex.id] = problem
                fn = standin_for(ex.id, problem, raw)
            _install(owner, attr, raw, fn, state)


def _run_snippets(
    module,
    snippets: List[SnippetSpec],
    exs: List[ExerciseSpec],
    problems: Dict[str, str],
    report: SwapReport,
) -> Dict[str, Any]:
    here = {ex.name for ex in exs}
    keep_out = {ex.target.split(":", 1)[1].rsplit(".", 1)[-1] for ex in exs}
    namespace = {**neighbour_names(module, keep_out), **vars(module)}
    namespace["__builtins__"] = builtins
    for snip in snippets:
        source, label = snip.source, snip.label
        # tracebacks show lines
        linecache.cache[label] = (
            len(source),
            None,
            source.splitlines(True),
            label,
        )
        try:
            code = compile(source, label, "exec", flags=ANNOTATIONS_FLAG, dont_inherit=True)
            exec(code, namespace)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # SystemExit too: a learner's sys.exit() must not end the judge
            msg = f"loading {label} raised {_one_line(e)}{_where(e, label)}"
            owner = snip.exercise
            if owner is not None:
                if owner in here:
                    problems.setdefault(owner, msg)
            else:
                # Code every exercise may depend on failed: none of this module's exercises is
                # reliable.
                if msg not in report.general:
                    report.general.append(msg)
                for name in here:
                    problems.setdefault(name, f"your code failed to load: {msg}")
    return namespace


def _bind_across_modules(units: List[UnitSpec], state: SwapState) -> None:
    """One function per exercise, whichever module calls it.

    Every snippet runs in the namespace of every target module, so an exercise defined in a cell
    exists once per namespace: `next_text` (home: detokenizer.py) is defined again in the copy of
    tokenize.py's globals, where names only detokenizer.py has (`REPLACEMENT`) do not resolve, and
    where it stays the learner's even in a rerun that puts the reference in its place. So each
    module-level exercise that the learner's code bound in a namespace is bound there to what its
    own module now holds: the installed learner function (or its stand-in), or the reference."""
    for module_name, namespace in state.homes:
        for unit in units:
            for ex in unit.exercises:
                qualname = ex.target.split(":", 1)[1]
                if "." in qualname:
                    continue  # a method: reached through its class, which holds the swapped one
                value = namespace.get(qualname)
                if not (inspect.isfunction(value) and value.__globals__ is namespace):
                    continue  # not the learner's code (the module's own global, or unbound)
                try:
                    home = importlib.import_module(ex.module)
                except Exception:  # reported where that module's exercises are swapped
                    continue
                if not hasattr(home, qualname):
                    continue
                namespace[qualname] = getattr(home, qualname)


def _resolve(module, target: str):
    """(the object holding the attribute, its name, the raw original as stored there)."""
    qualname = target.split(":", 1)[1]
    *path, attr = qualname.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    if isinstance(owner, type):
        for klass in owner.__mro__:  # the raw attribute (a property object, not its value)
            if attr in vars(klass):
                return owner, attr, vars(klass)[attr]
        raise AttributeError(f"{owner.__name__} has no attribute {attr!r}")
    return owner, attr, getattr(owner, attr)


_ABSENT = object()


def _learner_function(namespace, module, attr: str, raw, missing: str):
    """(the learner's plain function, None) or (None, why it cannot be used) or (None, None) if
    absent and the reference should stay."""
    # The namespace began as a copy of the module's globals: a name the learner's code did not bind
    # is still the module's own object (a module-level function's original, or an unrelated global).
    if namespace.get(attr, _ABSENT) is vars(module).get(attr, _ABSENT) or namespace.get(
        attr
    ) is unwrap_kind(raw):
        if missing == "reference":
            return None, None
        return None, f"no `def {attr}(...)` was defined by your code"
    fn = unwrap_kind(namespace[attr])
    if not callable(fn):
        return None, f"`{attr}` is a {type(fn).__name__}, not a function"
    problem = signature_problem(fn, unwrap_kind(raw), attr)
    return (None, problem) if problem else (fn, None)


def signature_problem(fn: Callable, reference: Callable, attr: str) -> str | None:
    """Why `fn` cannot be called the way the engine calls `reference`, or None. Parameter names and
    kinds must match (callers pass some by keyword); extra parameters need a default."""
    try:
        got, want = inspect.signature(fn), inspect.signature(reference)
    except (TypeError, ValueError):
        return None
    g, w = list(got.parameters.values()), list(want.parameters.values())
    ok = len(g) >= len(w)
    for i, p in enumerate(w):
        if not ok:
            break
        q = g[i]
        same_kind = q.kind == p.kind or (
            p.kind == p.POSITIONAL_OR_KEYWORD and q.kind == q.POSITIONAL_OR_KEYWORD
        )
        ok = (
            same_kind
            and (q.name == p.name or p.kind == p.POSITIONAL_ONLY)
            and not (p.default is not p.empty and q.default is q.empty)
        )
    for q in g[len(w) :]:
        ok = ok and (q.default is not q.empty or q.kind in (q.VAR_POSITIONAL, q.VAR_KEYWORD))
    if ok:
        return None
    return f"wrong signature: expected `def {attr}{_plain(want)}`, got `def {attr}{_plain(got)}`"


def _plain(sig: inspect.Signature) -> str:
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=sig.empty))


def _install(owner, attr, raw, fn, state: SwapState) -> None:
    new = rewrap(raw, fn)
    if isinstance(owner, type):
        if not isinstance(new, (property, classmethod, staticmethod)):
            new.__qualname__ = f"{owner.__qualname__}.{attr}"
        setattr(owner, attr, new)
    else:
        state.replacements[id(raw)] = new
        state.originals[id(raw)] = raw
        setattr(owner, attr, new)


def _replace_everywhere(state: SwapState, test_dirs: List[str]) -> None:
    replacements = state.replacements

    def holds(module) -> bool:
        name = getattr(module, "__name__", "") or ""
        if name.split(".")[0] in state.packages:
            return True
        path = getattr(module, "__file__", None) or ""
        return any(path.startswith(d) for d in test_dirs)

    dicts = [
        vars(m) for m in list(sys.modules.values()) if m is not None and holds(m)
    ] + state.namespaces
    for d in dicts:
        for key, value in list(d.items()):
            new = replacements.get(id(value))
            if new is not None and value is not new:
                d[key] = new


def _one_line(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}) (sys.exit() is not allowed in exercise code)"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _where(e: BaseException, label: str) -> str:
    if isinstance(e, SyntaxError) and e.lineno:
        return f" at line {e.lineno}"
    tb = e.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == label:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" at line {line}" if line else ""
