"""A tiny fake project for the judge's own tests: a package `fakepkg` (no torch, so each judged run
is a sub-second pytest), its tests, and a registry with a chapter, ch42, whose exercises cover
every kind of target (module function, method, property, classmethod), and a second one, ch43.

`fake_project(tmp_path, monkeypatch)` lays it out and points the judge at it (registry, variants,
notebooks and progress file all inside tmp_path); `notebook(cells)` builds an .ipynb as plain JSON.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

MODULE = '''
from __future__ import annotations

SCALE = 2


def double(x: int) -> int:
    """Return x times SCALE."""
    return x * SCALE


def total(xs) -> int:
    return sum(double(x) for x in xs)


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def bump(self, by: int = 1) -> None:
        """Add `by` to the count."""
        self.n += by

    @property
    def is_big(self) -> bool:
        """More than ten."""
        return self.n > 10

    @classmethod
    def starting_at(cls, n: int) -> "Counter":
        """A counter that starts at n."""
        c = cls()
        c.n = n
        return c
'''

USER = """
from fakepkg.mod import double


def quadruple(x):
    return double(double(x))
"""

TESTS = """
from fakepkg.mod import Counter, double, total
from fakepkg.user import quadruple


def test_double():
    assert double(3) == 6


def test_total():
    assert total([1, 2]) == 6


def test_quadruple():
    assert quadruple(1) == 4


def test_bump():
    c = Counter()
    c.bump()
    c.bump(2)
    assert c.n == 3


def test_is_big():
    assert Counter.starting_at(11).is_big and not Counter().is_big


def test_starting_at():
    assert Counter.starting_at(5).n == 5


def test_unrelated():
    assert 1 + 1 == 2
"""

REGISTRY = """
root = "{root}"

[ch42]
title = "A fake chapter"
test_files = ["fake_tests/test_fake.py"]

[[ch42.exercises]]
name = "double"
target = "fakepkg.mod:double"
tests = ["test_fake.py::test_double", "test_fake.py::test_total", "test_fake.py::test_quadruple"]

[[ch42.exercises]]
name = "bump"
target = "fakepkg.mod:Counter.bump"
tests = ["test_fake.py::test_bump"]

[[ch42.exercises]]
name = "is_big"
target = "fakepkg.mod:Counter.is_big"
tests = ["test_fake.py::test_is_big"]

[[ch42.exercises]]
name = "starting_at"
target = "fakepkg.mod:Counter.starting_at"
tests = ["test_fake.py::test_is_big", "test_fake.py::test_starting_at"]

[ch43]
title = "A second fake chapter"
test_files = ["fake_tests/test_fake43.py"]

[[ch43.exercises]]
name = "total"
target = "fakepkg.mod:total"
tests = ["test_fake43.py::test_total_of_nothing", "test_fake43.py::test_total_of_three"]
"""

TESTS_43 = """
from fakepkg.mod import total


def test_total_of_nothing():
    assert total([]) == 0


def test_total_of_three():
    assert total([1, 2, 3]) == 12
"""

# A correct solution of every exercise, in the learner's format.
SOLUTION = """
def double(x):
    return x * SCALE


def bump(self, by=1):
    self.n += by


def is_big(self):
    return self.n > 10


def starting_at(cls, n):
    c = cls()
    c.n = n
    return c
"""


@dataclass
class FakeProject:
    root: Path
    notebooks: Path
    progress: Path
    variants: Path

    def write(self, name: str, source: str) -> Path:
        path = self.root / name
        path.write_text(textwrap.dedent(source))
        return path


HINTS = {"double": ["first hint", "second hint", "third hint"], "bump": ["bump hint"]}


def write_hints(root: Path, chapter: str, hints: dict) -> None:
    """A chapter's hints where the judge looks for them: hints/chNN.toml beside the registry."""
    (root / "hints").mkdir(exist_ok=True)
    lines = [f"{name} = {json.dumps(tiers)}" for name, tiers in hints.items()]
    (root / "hints" / f"{chapter}.toml").write_text("\n".join(lines) + "\n")


def fake_project(tmp_path: Path, monkeypatch) -> FakeProject:
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(MODULE)
    (pkg / "user.py").write_text(USER)
    tests = tmp_path / "fake_tests"
    tests.mkdir()
    (tests / "test_fake.py").write_text(TESTS)
    (tests / "test_fake43.py").write_text(TESTS_43)
    (tmp_path / "registry.toml").write_text(REGISTRY.format(root=tmp_path))
    write_hints(tmp_path, "ch42", HINTS)
    project = FakeProject(
        tmp_path, tmp_path / "notebooks", tmp_path / "progress.json", tmp_path / "variants"
    )
    project.notebooks.mkdir()
    project.variants.mkdir()
    monkeypatch.setenv("MINISGL_JUDGE_REGISTRY", str(tmp_path / "registry.toml"))
    monkeypatch.setenv("MINISGL_JUDGE_NOTEBOOKS", str(project.notebooks))
    monkeypatch.setenv("MINISGL_JUDGE_PROGRESS", str(project.progress))
    monkeypatch.setenv("MINISGL_JUDGE_VARIANTS", str(project.variants))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # for the judge's subprocess
    monkeypatch.syspath_prepend(str(tmp_path))  # for the stub API, which reads fakepkg's source
    return project


def code_cell(source: str, exercise: str | None = None, support: bool = False) -> Dict:
    meta: Dict = {}
    if exercise:
        meta["minisgl"] = {"exercise": exercise}
        meta["tags"] = ["exercise"]
    if support:
        meta["minisgl"] = {"support": True}
    return {
        "cell_type": "code",
        "metadata": meta,
        "source": textwrap.dedent(source).splitlines(True),
        "outputs": [],
        "execution_count": None,
    }


def notebook(cells: List[Dict]) -> str:
    md = {"cell_type": "markdown", "metadata": {}, "source": ["# A fake chapter\n"]}
    return json.dumps({"cells": [md] + cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
