"""The exercise code the notebooks show, from the judge's stub API (`judge/stubs.py`).

The judge owns how a stub is cut out of the reference and how the reference is extracted; this
tool only places the results in cells, so a stub in a notebook is exactly what the judge expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List


@dataclass(frozen=True)
class ExerciseInfo:
    chapter: str
    name: str
    target: str  # "minisgl.module:Qualified.name"

    @property
    def key(self) -> str:
        return f"{self.chapter}.{self.name}"

    @property
    def module_path(self) -> str:
        return self.target.split(":")[0].replace(".", "/") + ".py"

    @property
    def qualname(self) -> str:
        return self.target.split(":")[1]


def _stubs():
    try:
        from judge import stubs
    except ImportError as e:  # the judge is not there: nothing sensible can be generated
        raise SystemExit(f"cannot import judge.stubs ({e}); the notebooks' exercise cells come from it") from None
    return stubs


def exercise_names(chapter: str) -> List[str]:
    return [_name_of(e) for e in _stubs().exercises(chapter)]


def info(chapter: str, name: str) -> ExerciseInfo:
    for e in _stubs().exercises(chapter):
        if _name_of(e) == name:
            target = e["target"] if isinstance(e, dict) else e.target
            return ExerciseInfo(chapter, name, target)
    known = ", ".join(exercise_names(chapter)) or "none"
    raise KeyError(f"{chapter}.{name} is not in judge/exercises.toml (the chapter's exercises: {known})")


def stub_source(chapter: str, name: str) -> str:
    return _stubs().stub_source(chapter, name).rstrip() + "\n"


def reference_source(chapter: str, name: str) -> str:
    return _stubs().reference_source(chapter, name).rstrip() + "\n"


def _name_of(e) -> str:
    return e["name"] if isinstance(e, dict) else e.name
