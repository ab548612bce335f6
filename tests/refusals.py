"""Checking that a call refuses its input, with a failure that names the input.

`pytest.raises` reports a call that returned as "DID NOT RAISE <class 'ValueError'>", and one whose
message misses the expected words as a regex mismatch: the input is only in the test's id. These
say which call, on which input, should have raised what, and what happened instead; where the
learner's code raised something else, the failure keeps that error as its cause or context, so the
judge names the learner's line too.

A stub's NotImplementedError (and the judge's LearnerCodeError stand-in for code it could not
load) always goes through, even where the expected error is a RuntimeError, of which
NotImplementedError is a subclass: the judge then reports the exercise as not written, not as
a wrong refusal.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Callable, Iterator, Tuple, Type, Union

import pytest

Errors = Union[Type[BaseException], Tuple[Type[BaseException], ...]]


def _names(error: Errors) -> str:
    kinds = error if isinstance(error, tuple) else (error,)
    return " or ".join(k.__name__ for k in kinds)


def _passes_through(e: BaseException) -> bool:
    return isinstance(e, NotImplementedError) or type(e).__name__ == "LearnerCodeError"


class Refusal:
    """What `refuses` caught: `.value`, the exception (as pytest's ExceptionInfo has it)."""

    value: BaseException | None = None


@contextmanager
def refuses(
    error: Errors, what: str, match: str | None = None, naming: str | None = None
) -> Iterator[Refusal]:
    """The block must raise `error` (its message searched for the regex `match`, or holding the
    words `naming`, if given); `what` names the call and its input: "SamplingParams(top_p=0.0)"."""
    refusal = Refusal()
    wanted = _names(error) + (f" naming {match or naming!r}" if match or naming else "")
    try:
        yield refusal
    except error as e:
        if _passes_through(e):
            raise
        if (match is not None and not re.search(match, str(e))) or (
            naming is not None and naming not in str(e)
        ):
            pytest.fail(
                f"{what} raised {type(e).__name__}: {str(e)[:200]!r}; expected a {wanted}",
                pytrace=False,
            )
        refusal.value = e
        return
    except Exception as e:
        if _passes_through(e):
            raise
        # raised inside this handler, so the failure keeps `e` as its context: the judge names
        # the learner's line that raised it (failure_messages.learner_frame)
        pytest.fail(
            f"{what} raised {type(e).__name__}: {str(e)[:200]!r}; expected a {wanted}",
            pytrace=False,
        )
    pytest.fail(f"{what} returned, expected it to raise {wanted}", pytrace=False)


def raised(call: Callable[[], object], what: str, expected: str = "") -> BaseException:
    """The exception `call()` raised (any kind), or a failure saying `what` returned instead (and
    what it returned, and `expected`, the refusal wanted, where given)."""
    try:
        got = call()
    except Exception as e:
        if _passes_through(e):
            raise
        return e
    wanted = expected or "it to raise"
    pytest.fail(f"{what} returned {got!r}, expected {wanted}", pytrace=False)


def refused_as_wanted(err: BaseException, ok: bool, message: str) -> None:
    """Fail with `message` unless `ok`, for a test that checks what `raised` returned: the failure
    is raised from `err`, so the judge shows, beside the message, the learner's line that raised
    it (as a try-out's line does), not only the rule and the error."""
    if not ok:
        raise AssertionError(message) from err
