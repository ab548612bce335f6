"""Trying an exercise out in a notebook, before and after it is written.

The lines after an exercise's function run it inside the engine. While the function is still the
stub, that raises its `NotImplementedError("chNN.name: ...")`; `attempt` turns exactly that into a
short note, so "Run All" in JupyterLab goes on to the end of the notebook (also when something
re-raised it: Triton's interpreter wraps a kernel's exception in its own, the stub's as its cause).
Any other error, such as one in the learner's own code, ends the try-out with one ✘ line instead
of a traceback (`_stopped`): the rule of the check that was about to run, what was raised, and the
learner's line that raised it. Another exercise's stub is raised as usual: a try-out that needs a
second exercise written is the book's mistake, not the learner's.

Once it is written, the try-out checks it with `check`: one line per rule the judge's tests also
check, `✔ all request slots back` or `✘ all request slots back: 4 missing`, so a mistake shows
in the notebook before the judge runs. A check states the rule and what was seen, never the
reference's answer.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
import sys
import sysconfig
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Callable, Iterator, List, Tuple

from .engine_names import in_learner_terms
from .kernel_errors import causes as _chain
from .kernel_errors import in_chapter_words, refused_rule

PASS, FAIL = "✔", "✘"
NOT_WRITTEN = "is not written yet"


SENTINEL = re.compile(r"ch\d\d\.\w+: ")


@contextmanager
def attempt(exercise: str) -> Iterator[None]:
    tryout = _caller()
    _checked.clear()
    _refusals.clear()
    try:
        yield
    except Exception as raised:
        e = _stub_error(raised, exercise)
        if e is not None:
            print(
                f"{exercise} {NOT_WRITTEN} ({str(e)[len(exercise) + 2 :]}).\n"
                "Write the function above and run this cell again; the cells below do not need it."
            )
            return
        if tryout is None or any(
            isinstance(x, NotImplementedError) and SENTINEL.match(str(x)) for x in _chain(raised)
        ):
            raise
        print(_stopped(raised, tryout))


def _caller() -> FrameType | None:
    """The frame of the `with attempt(...)` block: the first one outside this file and
    contextlib."""
    frame = sys._getframe(1)
    here = os.path.abspath(__file__)
    while frame is not None and (
        os.path.abspath(frame.f_code.co_filename) == here
        or frame.f_code.co_filename.endswith("contextlib.py")
    ):
        frame = frame.f_back
    return frame


def _frames(tb: TracebackType | None) -> Iterator[Tuple[FrameType, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _stopped(raised: BaseException, tryout: FrameType) -> str:
    """The ✘ line for a try-out that raised: the rule it was about to check, the error (the
    first cause, where Triton's interpreter wraps it), and the learner's line."""
    cell = tryout.f_code.co_filename
    line = next((n for f, n in _frames(raised.__traceback__) if f is tryout), None)
    rule = _next_rule(tryout, line) if line is not None else None
    # Triton's interpreter re-raises a kernel's error as an InterpreterError from it, and a message-
    # less error (asyncio's TimeoutError) is clearer as itself than as its message-less cause
    root = raised
    while (
        root.__cause__ is not None
        and str(root.__cause__).strip()
        and (type(root).__name__ == "InterpreterError" or not str(root).strip())
    ):
        root = root.__cause__
    said = in_learner_terms((str(root).strip().splitlines() or [""])[0][:200])
    words = in_chapter_words(raised)  # a Triton refusal as the rule it broke, with its values
    what = f"{type(root).__name__}: {words or said}" if (words or said) else type(root).__name__
    # the deepest line of the learner's code in any exception of the chain, the error shown first
    # (a jitted helper's line, not the try-out's launch that Triton's InterpreterError was raised
    # at); else the try-out's own line that raised
    where = None
    shown_first = _chain(root)
    for e in shown_first + [e for e in _chain(raised) if e not in shown_first]:
        for f, n in _frames(e.__traceback__):
            if _learners(f, tryout):
                where = (f, n)
        if where is not None:
            break
    if where is not None:
        f, n = where
        text = _statement(f.f_code.co_filename, n)
        at = f"your {f.f_code.co_name}, line {n}" + (f" (`{text}`)" if text else "")
    else:
        # the try-out's own deepest line (a helper it defined, or the block itself)
        ours = next(
            (
                found
                for e in shown_first + [e for e in _chain(raised) if e not in shown_first]
                for found in [
                    [n for f, n in _frames(e.__traceback__) if f.f_code.co_filename == cell]
                ]
                if found
            ),
            [line if line is not None else tryout.f_lineno],
        )
        n = ours[-1]
        text = _statement(cell, n)
        at = f"the try-out's line {n}" + (f" (`{text}`)" if text else "")
        engine = _engine_line(shown_first)
        if engine is not None:
            # a value the learner's function returned (a tile of the wrong shape) fails where the
            # engine's code uses it: that line tells more than the try-out's own
            at = f"what your function returned, used at the engine's {engine},"
    # a Triton refusal breaks a rule of its own, whatever the check it stopped was about
    rule = refused_rule(raised) or rule
    if rule is None and not linecache.getlines(cell) and _checked:
        # the cell's source is unknown (run by exec, not by a kernel): the last rule printed
        rule = f"the check after “{_checked[-1]}”"
    rule = rule or "the try-out's last lines"
    return f"{FAIL} {rule}: {at} raised {what}"


def _learners(frame: FrameType, tryout: FrameType) -> bool:
    """Whether `frame` runs the learner's code: a notebook cell's (the cells share a folder) or a
    file of the learner's own, anything but the try-out block itself and installed code (the
    standard library, site-packages, this project's packages)."""
    name = frame.f_code.co_filename
    if frame is tryout or (
        name == tryout.f_code.co_filename and frame.f_code.co_firstlineno in _tryout_lines(tryout)
    ):
        return False
    if os.path.dirname(name) == os.path.dirname(tryout.f_code.co_filename):
        return True
    if name.startswith("<") or not os.path.isabs(name):
        return False
    path = os.path.realpath(name)
    return not any(path.startswith(lib + os.sep) for lib in _LIBRARIES)


_PROJECT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_LIBRARIES = {
    os.path.realpath(p)
    for p in (
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
        *(os.path.join(_PROJECT, pkg) for pkg in ("minisgl", "classroom", "judge", "tests")),
    )
}


def _statement(filename: str, line: int) -> str:
    """The statement at `line` of a file or cell, on one line (a call spread over lines whole),
    cut to 120 characters; "" when the source is not known."""
    lines = linecache.getlines(filename)
    if not 0 < line <= len(lines):
        return ""
    text = lines[line - 1].strip()
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        tree = None
    if tree is not None:
        spans = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.stmt)
            and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            and (node.end_lineno or node.lineno) - node.lineno < 8
        ]
        if spans:
            inner = min(spans, key=lambda node: (node.end_lineno or node.lineno) - node.lineno)
            text = " ".join(
                part.strip() for part in lines[inner.lineno - 1 : inner.end_lineno or inner.lineno]
            )
            text = re.sub(r",?\s+([)\]}])", r"\1", re.sub(r"([(\[{])\s+", r"\1", text))
    return text if len(text) <= 120 else text[:117] + "..."


def _engine_line(chain: List[BaseException]) -> str | None:
    """The deepest line of the engine's own code (minisgl/) in the first exception of `chain` that
    has one, as "triton_decode.py line 160 (`...`)"; None when none does."""
    engine = os.sep + "minisgl" + os.sep
    for e in chain:
        found = [(f, n) for f, n in _frames(e.__traceback__) if engine in f.f_code.co_filename]
        if found:
            f, n = found[-1]
            text = linecache.getline(f.f_code.co_filename, n).strip()
            name = os.path.basename(f.f_code.co_filename)
            return f"{name} line {n}" + (f" (`{text}`)" if text else "")
    return None


def _tryout_lines(tryout: FrameType) -> range:
    """The lines of the `with attempt(...)` block the try-out frame is in: code defined there (a
    helper of the try-out's) is the try-out's, not the learner's."""
    try:
        tree = ast.parse("".join(linecache.getlines(tryout.f_code.co_filename)))
    except SyntaxError:
        return range(0)
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(
            isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Name)
            and item.context_expr.func.id == "attempt"
            for item in node.items
        ):
            return range(node.lineno, (node.end_lineno or node.lineno) + 1)
    return range(0)


def _next_rule(tryout: FrameType, line: int) -> str | None:
    """The rule of the first `check(...)` of the try-out that ends at or after `line`, its
    f-string filled in from the try-out's variables where it can be."""
    source = "".join(linecache.getlines(tryout.f_code.co_filename))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "check"
        and node.args
        and (node.end_lineno or node.lineno) >= line
    ]
    if not calls:
        return None
    first = min(calls, key=lambda node: node.lineno).args[0]
    try:
        value = eval(  # the try-out's own f-string, in its own variables
            compile(ast.Expression(first), "<rule>", "eval"), tryout.f_globals, tryout.f_locals
        )
        return str(value)
    except Exception:
        return ast.unparse(first)


def _stub_error(e: BaseException | None, exercise: str) -> NotImplementedError | None:
    """The exercise's stub's NotImplementedError, `e` itself or what it was raised from."""
    seen = []
    while e is not None and e not in seen:
        if isinstance(e, NotImplementedError) and str(e).startswith(f"{exercise}:"):
            return e
        seen.append(e)
        e = e.__cause__ or e.__context__
    return None


def check(rule: str, ok: bool, seen: str = "") -> bool:
    """Print `✔ rule`, or `✘ rule: seen` (what was seen instead, in plain words); returns `ok`."""
    print(f"{PASS} {rule}" if ok else f"{FAIL} {rule}" + (f": {seen}" if seen else ""))
    _checked.append(rule)
    return bool(ok)


_checked: List[str] = []  # the rules checked so far in the current try-out
_refusals: List[str] = []  # the ✘ lines kernel_run printed in the current try-out


def kernel_run(run: Callable[[], object]) -> Tuple[bool, object]:
    """(True, what `run()` returned), or (False, None) where the learner's kernel code made Triton
    refuse (classroom/kernel_errors): that refusal is printed as a ✘ line under the rule it broke,
    with the learner's line (once per try-out), and the try-out goes on to its other checks, so
    one refusal does not hide what else is right or wrong. Any other error goes on up to
    `attempt`, which stops the try-out there."""
    try:
        return True, run()
    except Exception as e:
        tryout = _caller()
        if tryout is None or refused_rule(e) is None:
            raise
        line = _stopped(e, tryout)
        if line not in _refusals:
            _refusals.append(line)
            print(line)
        return False, None


def raises(error: type, run: Callable[[], object]) -> Tuple[bool, str]:
    """Whether `run()` raises `error` (any message), and if not, what came instead, in words
    ("it returned 1.0", "it raised ZeroDivisionError: division by zero"), for a check's `seen`.
    A stub's NotImplementedError goes on up, to `attempt`."""
    try:
        got = run()
    except error:
        return True, ""
    except NotImplementedError:
        raise
    except Exception as e:
        return False, f"it raised {type(e).__name__}: {e}"
    return False, f"it returned {got!r}"


def raised_where(e: BaseException) -> str:
    """Where the learner's code raised `e`, for a check's seen-string, as the try-out's other
    lines give it: " (at your revive, line 12: `cls = MESSAGE_TYPES[name]`)"; "" when no frame
    of the learner's code is in its traceback. For a try-out's helper that catches what the
    learner's function raised and reports it as what was seen (chapter 12's `refusal`)."""
    helper = _caller()
    found = None
    for f, n in _frames(e.__traceback__):
        if helper is not None and _learners(f, helper):
            found = (f, n)
    if found is None:
        return ""
    f, n = found
    text = _statement(f.f_code.co_filename, n)
    return f" (at your {f.f_code.co_name}, line {n}" + (f": `{text}`)" if text else ")")


def client_reads(model, body):
    """`body` as the openai client's pydantic `model` reads it: (the parsed object, "") or (None,
    what it refused, in words). A try-out then reports a field the client cannot read as a ✘ line
    that names the field and what it held, instead of raising pydantic's ValidationError."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body), ""
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return None, (
            f"the openai client cannot read this {model.__name__}: at {where!r} it found "
            f"{first.get('input')!r} ({first['msg']})"
        )
