"""Whether a message's fields hold what its class declares (`wire.revive`'s last check).

A dataclass checks nothing: `AbortMsg(uid="x")` is built without a word, and the scheduler fails
later, far from the frame that carried it. A frame comes from another process, so the receiver
checks each field against the class's annotations: the few forms the messages use (a class,
`X | None`, `List[X]`, `Dict[K, V]`, `Any`), nothing more general.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Dict, List


@functools.cache
def _hints(cls: type) -> Dict[str, Any]:
    return typing.get_type_hints(cls)  # the messages' annotations are strings (postponed)


def _holds(value: Any, hint: Any) -> bool:
    if hint is Any or hint is object:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_holds(value, h) for h in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_holds(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(hint) or (Any, Any)
        return isinstance(value, dict) and all(
            _holds(k, key) and _holds(v, item) for k, v in value.items()
        )
    if hint is type(None):
        return value is None
    if hint is int:  # JSON's true is a bool, which Python counts as an int: not a uid
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def mistyped_fields(message: Any) -> List[str]:
    """Each field of the dataclass `message` whose value is not of its declared type, as
    "uid='x' (int expected)"; empty when every field holds its type."""
    hints = _hints(type(message))
    wrong = []
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if not _holds(value, hints[f.name]):
            wanted = hints[f.name]
            name = getattr(wanted, "__name__", None) or str(wanted).replace("typing.", "")
            wrong.append(f"{f.name}={value!r} ({name} expected)")
    return wrong
