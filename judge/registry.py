"""The exercise registry (`judge/exercises.toml`) as typed objects.

Only the standard library is used here: the judge's parent process, `judge.check` inside a learner's
kernel and the notebook generator all read the registry without importing torch or the engine.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from . import settings

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REGISTRY = Path(__file__).resolve().parent / "exercises.toml"
# Tests of the judge point it at a registry (tiny fake chapters) and variants of their own.
REGISTRY_ENV, VARIANTS_ENV = settings.REGISTRY.name, settings.VARIANTS.name


class RegistryError(ValueError):
    """The registry file is missing a field or has a malformed one (the message says which)."""


class MissingPackage(Exception):
    """A chapter's `requires` names a package this Python cannot import (the message says how to
    install it)."""


class UnknownChapter(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Exercise:
    chapter: str  # "ch11"
    name: str  # "process_last_data"
    target: str  # "minisgl.scheduler.scheduler:Scheduler._process_last_data"
    tests: Tuple[str, ...]  # "test_ch11_overlap.py::test_name": what a wrong version must fail
    hints: Tuple[str, ...]  # 1 the rule that matters, 2 the approach, 3 the steps
    todo: str = ""  # optional: the stub's one-line "what to implement" (else from the docstring)
    # Mutants of the reference that no test can kill because they compute the same thing:
    # (mutant id, the one-line reason), reviewed one by one (python -m tools.mutants).
    equivalent_mutants: Tuple[Tuple[str, str], ...] = ()
    # Environment the test process gets while this exercise is swapped in, so that the engine runs
    # the learner's code (on a GPU the Triton fast paths would skip some plain-torch functions):
    # (variable, value) pairs, each a setting of minisgl/env.py with one of its allowed values.
    engine_env: Tuple[Tuple[str, str], ...] = ()
    # (error class name, the rule's words): an error of that class raised by this exercise's own
    # function, wherever a test meets it (an engine run too), is reported as the rule it breaks
    # (failure_messages.exercise_rule), not as a bare "KeyError: 0".
    raises: Tuple[Tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.chapter}.{self.name}"

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]

    @property
    def attr(self) -> str:
        """The name the learner's `def` must have: the target's last component."""
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def owner(self) -> str | None:
        """The class holding the target, or None for a module-level function."""
        return self.qualname.rsplit(".", 1)[0] if "." in self.qualname else None

    def judges(self, nodeid: str) -> bool:
        """Whether the test `nodeid` (as pytest names it) is one of this exercise's tests."""
        return any(test_matches(ref, nodeid) for ref in self.tests)


@dataclass(frozen=True)
class Chapter:
    key: str  # "ch11"
    number: int
    title: str
    test_files: Tuple[Path, ...]  # absolute
    exercises: Tuple[Exercise, ...]
    # Packages the chapter's code imports beyond the default install (e.g. "triton"), each the
    # name of an extra of the same name in pyproject.toml: the judge names the install command
    # instead of failing every test with an ImportError.
    requires: Tuple[str, ...] = ()

    def exercise(self, name: str) -> Exercise:
        for ex in self.exercises:
            if name in (ex.name, ex.attr, ex.id):
                return ex
        known = ", ".join(e.name for e in self.exercises) or "none"
        raise UnknownChapter(f"{self.key} has no exercise {name!r} (its exercises: {known})")


@dataclass(frozen=True)
class Registry:
    path: Path
    chapters: Dict[str, Chapter]

    def chapter(self, name: str | int) -> Chapter:
        key = chapter_key(name)
        if key is None or key not in self.chapters:
            known = ", ".join(self.chapters)
            raise UnknownChapter(f"unknown chapter {str(name)!r}: the chapters are {known}")
        return self.chapters[key]

    def up_to(self, name: str | int) -> List[Chapter]:
        last = self.chapter(name).number
        return [c for c in self.chapters.values() if c.number <= last]


def missing_extras(extras) -> List[str]:
    """The extras of pyproject.toml (each named after the package it installs: "triton") that
    this Python cannot import, looked up without importing them (triton takes seconds)."""
    return [m for m in extras if importlib.util.find_spec(m) is None]


def install_command(extras) -> str:
    """The command that installs these extras into the checkout's editable install."""
    return f'pip install -e ".[{",".join(extras)}]"'


def check_requirements(chapters) -> None:
    """Raise MissingPackage, naming the install command, when a chapter's `requires` is not
    importable here."""
    for c in chapters:
        missing = missing_extras(c.requires)
        if missing:
            raise MissingPackage(
                f"{c.key} ({c.title}) needs {' and '.join(missing)}, which is not installed here: "
                + install_command(missing)
            )


def chapter_key(name: str | int) -> str | None:
    """'ch11', 'ch3', '11', 11 -> 'ch11' / 'ch03'; None when it is not a chapter name at all."""
    m = re.fullmatch(r"(?:ch)?(\d{1,2})", str(name).strip().lower())
    return f"ch{int(m.group(1)):02d}" if m else None


def test_matches(ref: str, nodeid: str) -> bool:
    """A registry test reference ('test_x.py::test_y', or with a 'tests/' prefix) names a pytest
    node
    id ('tests/test_x.py::test_y'), or all parametrizations of it ('...::test_y[a-1]')."""
    ref_file, _, ref_rest = ref.partition("::")
    file, _, rest = nodeid.partition("::")
    if Path(ref_file).name != Path(file).name:
        return False
    return rest == ref_rest or rest.startswith(ref_rest + "[")


test_matches.__test__ = False  # type: ignore[attr-defined]  # a helper, not a pytest test


def load_registry(path: str | Path | None = None) -> Registry:
    path = Path(path or settings.REGISTRY.read() or DEFAULT_REGISTRY)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"exercise registry not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"{path} is not valid TOML: {e}") from None
    # Relative test paths are relative to the repository holding the registry (judge/..), unless
    # the file says otherwise with a top-level `root`.
    root = Path(raw.pop("root")) if "root" in raw else path.resolve().parent.parent
    chapters: Dict[str, Chapter] = {}
    for key, table in raw.items():
        if chapter_key(key) != key or not isinstance(table, dict):
            raise RegistryError(f"{path}: [{key}] is not a chapter table like [ch03]")
        hints = _hints(path, key, [e.get("name") for e in table.get("exercises", [])])
        exercises = tuple(
            _exercise(path, key, i, e, hints) for i, e in enumerate(table.get("exercises", []))
        )
        names = [e.name for e in exercises]
        if len(set(names)) != len(names):
            raise RegistryError(f"{path}: [{key}] lists an exercise name twice")
        chapters[key] = Chapter(
            key=key,
            number=int(key[2:]),
            title=str(table.get("title", key)),
            test_files=tuple((root / f).resolve() for f in table.get("test_files", [])),
            exercises=exercises,
            requires=_requires(path, key, table.get("requires", [])),
        )
    return Registry(path, dict(sorted(chapters.items())))


def _requires(path: Path, chapter: str, value: object) -> Tuple[str, ...]:
    names = isinstance(value, list) and all(isinstance(m, str) and m.isidentifier() for m in value)
    if not names:
        raise RegistryError(
            f'{path}: [{chapter}] `requires` must be a list of package names like ["triton"]'
        )
    return tuple(value)


def hints_file(registry: Path, chapter: str) -> Path:
    """Where a chapter's hints live: hints/chNN.toml beside the registry, out of the list of
    exercises a learner is sent to (one array of tiers per exercise name)."""
    return registry.resolve().parent / "hints" / f"{chapter}.toml"


def _hints(registry: Path, chapter: str, names: List[object]) -> Dict[str, Tuple[str, ...]]:
    path = hints_file(registry, chapter)
    if not path.is_file():
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"{path} is not valid TOML: {e}") from None
    for name, tiers in raw.items():
        if name not in names:
            raise RegistryError(
                f"{path}: `{name}` is not an exercise of [{chapter}] in {registry.name} "
                f"(they are {', '.join(map(str, names))})"
            )
        if not isinstance(tiers, list) or not all(isinstance(t, str) for t in tiers):
            raise RegistryError(f"{path}: `{name}` must be a list of strings (the hint tiers)")
    return {name: tuple(tiers) for name, tiers in raw.items()}


def _exercise(
    path: Path, chapter: str, i: int, e: object, hints: Dict[str, Tuple[str, ...]]
) -> Exercise:
    where = f"{path}: [[{chapter}.exercises]] #{i + 1}"
    if not isinstance(e, dict):
        raise RegistryError(f"{where} is not a table")
    if "hints" in e:
        raise RegistryError(
            f"{where}: hints go in {hints_file(path, chapter)} (`{e.get('name')} = [...]`), "
            "not in the list of exercises a learner reads"
        )
    for field in ("name", "target"):
        if not isinstance(e.get(field), str) or not e[field]:
            raise RegistryError(f"{where} needs a `{field}` string")
    if not re.fullmatch(r"[\w.]+:[\w.]+", e["target"]):
        raise RegistryError(
            f"{where}: target {e['target']!r} is not 'package.module:Qualified.name'"
        )
    if not all(isinstance(x, str) for x in e.get("tests", [])):
        raise RegistryError(f"{where}: `tests` must be a list of strings")
    equivalents = []
    for m in e.get("equivalent_mutants", []):
        if not (
            isinstance(m, dict)
            and isinstance(m.get("id"), str)
            and isinstance(m.get("why"), str)
            and m["id"]
            and m["why"].strip()
        ):
            raise RegistryError(
                f"{where}: each of `equivalent_mutants` needs an `id` and a `why` string"
            )
        equivalents.append((m["id"], m["why"].strip()))
    return Exercise(
        chapter=chapter,
        name=e["name"],
        target=e["target"],
        tests=tuple(e.get("tests", [])),
        hints=hints.get(e["name"], ()),
        todo=str(e.get("todo", "")),
        equivalent_mutants=tuple(equivalents),
        engine_env=_engine_env(where, e.get("engine_env", {})),
        raises=_raises(where, e.get("raises", {})),
    )


def _raises(where: str, table: object) -> Tuple[Tuple[str, str], ...]:
    """An exercise's `raises`: error class names (`KeyError`), each with the rule's words."""
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and k.isidentifier() and isinstance(v, str) and v.strip()
        for k, v in table.items()
    ):
        raise RegistryError(
            f'{where}: `raises` must be a table like {{ KeyError = "the rule it breaks" }}'
        )
    return tuple((k, v.strip()) for k, v in table.items())


def _engine_env(where: str, table: object) -> Tuple[Tuple[str, str], ...]:
    """An exercise's `engine_env`, checked against the engine's settings (minisgl/env.py, which
    imports nothing but the standard library)."""
    from minisgl.env import SETTINGS

    if not isinstance(table, dict):
        raise RegistryError(
            f'{where}: `engine_env` must be a table like {{ MINISGL_FUSED_KERNELS = "0" }}'
        )
    known = {s.name: s for s in SETTINGS}
    for name, value in table.items():
        if name not in known:
            raise RegistryError(
                f"{where}: engine_env names {name}, which is not a setting of minisgl/env.py "
                f"(they are {', '.join(known)})"
            )
        if not isinstance(value, str):
            raise RegistryError(f"{where}: engine_env {name} must be a string, got {value!r}")
        try:
            known[name].parse(value)
        except ValueError as e:
            raise RegistryError(f"{where}: engine_env {e}") from None
    return tuple(sorted(table.items()))


def variants_dir() -> Path:
    return Path(settings.VARIANTS.read() or Path(__file__).resolve().parent / "variants")


def variant_files(chapter: Chapter, name: str | None = None) -> List[Path]:
    """The known-wrong variants of `chapter`: judge/variants/chNN_*.diff (edits of the reference,
    judge/variant_edits.py) and chNN_*.py (whole functions); with `name`, the variant chNN_<name>,
    or else every chNN_<name>_*."""
    folder = variants_dir()

    def files(stem: str) -> List[Path]:
        found = [p for s in (".diff", ".py") for p in folder.glob(stem + s)]
        return sorted(found, key=lambda p: p.stem)

    if name is None:
        return files(f"{chapter.key}_*")
    exact = files(f"{chapter.key}_{name}")
    return exact or files(f"{chapter.key}_{name}_*")
