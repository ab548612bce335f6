"""Environment switches, read once at import and changeable at run time (tests flip them).

Each switch is an object with a `.value` so that code holding a reference to `ENV` always sees the
current setting, whoever changed it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


TRUE, FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _env_flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in TRUE + FALSE:
        # A typo must not silently mean the opposite of what was meant.
        raise ValueError(f"{name}={raw!r}: use one of {', '.join(TRUE)} (on) or {', '.join(FALSE[1:])} (off)")
    return value in TRUE


def _env_choice(name: str, default: str, allowed: tuple) -> str:
    raw = os.environ.get(name, default).strip().lower()
    if raw not in allowed:
        raise ValueError(f"{name}={raw!r}: use one of {', '.join(allowed)}")
    return raw


@dataclass
class Switch:
    name: str
    value: object

    def __bool__(self) -> bool:
        return bool(self.value)


class _Env:
    def __init__(self) -> None:
        # The overlap loop is the default, as in upstream; set to 1 for the normal (synchronous) loop.
        self.DISABLE_OVERLAP_SCHEDULING = Switch(
            "MINISGL_DISABLE_OVERLAP_SCHEDULING", _env_flag("MINISGL_DISABLE_OVERLAP_SCHEDULING")
        )
        # "eager" (work runs when launched) or "deferred" (work on the engine stream runs only when
        # someone synchronizes on it): the deferred mode makes stream-ordering bugs visible on a CPU.
        self.CPU_STREAMS = Switch("MINISGL_CPU_STREAMS", _env_choice("MINISGL_CPU_STREAMS", "eager", ("eager", "deferred")))
        # `LLM.generate`'s progress bar (minisgl/llm/progress.py): "auto" shows it for runs that
        # last, where someone watches (a terminal, a notebook), never under pytest or CI; "off"
        # never, even when asked for (what the workbook's notebook runs use); "on" whenever asked.
        self.PROGRESS = Switch("MINISGL_PROGRESS", _env_choice("MINISGL_PROGRESS", "auto", ("auto", "on", "off")))


ENV = _Env()
