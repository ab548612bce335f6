"""Trying an exercise out in a notebook, before and after it is written.

The lines after an exercise's function run it inside the engine. While the function is still the
stub, that raises its `NotImplementedError("chNN.name: ...")`; `attempt` turns exactly that into a
short note, so "Run All" in JupyterLab goes on to the end of the notebook (also when something
re-raised it: Triton's interpreter wraps a kernel's exception in its own, the stub's as its cause).
Any other error, such as one in the learner's own code, is raised as usual.

Once it is written, the try-out checks it with `check`: one line per rule the judge's tests also
check, `✔ all request slots back` or `✘ all request slots back: 4 missing`, so a mistake shows
in the notebook before the judge runs. A check states the rule and what was seen, never the
reference's answer.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Tuple

PASS, FAIL = "✔", "✘"
NOT_WRITTEN = "is not written yet"


@contextmanager
def attempt(exercise: str) -> Iterator[None]:
    try:
        yield
    except Exception as raised:
        e = _stub_error(raised, exercise)
        if e is None:
            raise
        print(
            f"{exercise} {NOT_WRITTEN} ({str(e)[len(exercise) + 2 :]}).\n"
            "Write the function above and run this cell again; the cells below do not need it."
        )


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
    return bool(ok)


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
