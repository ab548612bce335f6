"""Points per exercise, in one place: `judge/grading/points.toml` (or the file given with
`--points`). An exercise earns its points when every one of its tests passes (the judge's
"passing"); any other status earns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

DEFAULT_FILE = Path(__file__).with_name("points.toml")


@dataclass(frozen=True)
class Points:
    default: float
    per_exercise: Dict[str, float]  # "ch01.complete_one" -> points

    def of(self, exercise_id: str) -> float:
        return self.per_exercise.get(exercise_id, self.default)


def load(path: Optional[Path] = None) -> Points:
    path = Path(path) if path else DEFAULT_FILE
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"points file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"points file {path} is not valid TOML: {e}") from None
    default = data.pop("default", 1)
    per = data.pop("exercises", {})
    if data:
        raise ValueError(
            f"points file {path}: unknown keys {sorted(data)} (expected default, exercises)"
        )
    if not _number(default):
        raise ValueError(f"points file {path}: default must be a number >= 0, got {default!r}")
    for name, value in per.items():
        if "." not in name:
            raise ValueError(
                f"points file {path}: {name!r} should be chNN.exercise, e.g. ch01.complete_one"
            )
        if not _number(value):
            raise ValueError(f"points file {path}: {name} must be a number >= 0, got {value!r}")
    return Points(float(default), {k: float(v) for k, v in per.items()})


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
