"""The checks of SamplingParams' fields (minisgl/core.py), `check(name, value)`: each raises
TypeError (a wrong type; a bool is not a number here) or ValueError (NaN, infinite, out of range)
naming the field, or returns. A field names its checks where it is declared:
`temperature: float = _rule(0.0, checks.number, checks.at_least(0))`."""

from __future__ import annotations

import math
from typing import Any, Callable

from minisgl.structured.constraint import check_constraint

Check = Callable[[str, Any], None]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


def integer(name: str, value: Any) -> None:
    if not is_int(value):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def at_least(low: float) -> Check:
    def check(name: str, value: Any) -> None:
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")

    return check


def between(low: float, high: float) -> Check:
    def check(name: str, value: Any) -> None:
        if not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")

    return check


def optional(check: Check) -> Check:
    """`check`, with None allowed (and said so when the type is wrong)."""

    def optional(name: str, value: Any) -> None:
        try:
            if value is not None:
                check(name, value)
        except TypeError as e:
            raise TypeError(str(e).replace(" must be ", " must be None or ", 1)) from None

    return optional


def top_k(name: str, value: int) -> None:
    if value == 0 or value < -1:
        raise ValueError(f"{name} must be -1 (off) or an integer >= 1, got {value!r}")


def top_p(name: str, value: float) -> None:
    if not (0.0 < value <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {value}")


def strings(name: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise TypeError(f"{name} must be a string or a list of strings, got {value!r}")
    if any(s == "" for s in value):
        raise ValueError(f"{name} must not hold an empty string (it would end every request)")


def token_ids(name: str, value: Any) -> None:
    if not isinstance(value, list) or not all(is_int(i) for i in value):
        raise TypeError(f"{name} must be a list of integers, got {value!r}")
    if any(i < 0 for i in value):
        raise ValueError(f"{name} must be token ids >= 0, got {value!r}")


def constraint(name: str, value: Any) -> None:
    """A structured-output constraint's shape (minisgl/structured/constraint.py); the grammar
    itself is compiled, and refused with the library's error, when the request is taken in."""
    check_constraint(value)
