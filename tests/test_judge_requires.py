"""A chapter whose code needs a package beyond the default install (`requires` in the registry,
e.g. triton for the kernel chapters): the judge names the install command in one line instead of
failing every test with an ImportError, from the terminal and from a notebook alike."""

from __future__ import annotations

import re

import pytest
import tomllib

from judge import live
from judge.cli import EXIT_USAGE, main
from judge.registry import REPO, RegistryError, load_registry
from judge_fixtures import fake_project

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def _require(project, value: str) -> None:
    path = project.root / "registry.toml"
    text = path.read_text()
    path.write_text(
        text.replace('title = "A fake chapter"', f'title = "A fake chapter"\nrequires = {value}')
    )


def test_a_missing_package_is_named_with_its_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    project = fake_project(tmp_path, monkeypatch)
    _require(project, '["no_such_package_here"]')
    for argv in (["ch42", "--solution"], ["ch42", "--file", str(project.write("m.py", "x = 1"))]):
        assert main(argv) == EXIT_USAGE
        err = capsys.readouterr().err
        assert 'pip install -e ".[no_such_package_here]"' in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert not project.progress.exists()  # nothing ran, nothing recorded


def test_the_notebook_check_says_the_same_in_one_line(tmp_path, monkeypatch, capsys):
    project = fake_project(tmp_path, monkeypatch)
    _require(project, '["no_such_package_here"]')
    assert live.check("ch42", namespace={}) is None
    out = capsys.readouterr().out
    assert out.strip().startswith("judge: ch42") and '".[no_such_package_here]"' in out


def test_an_installed_requirement_changes_nothing(tmp_path, monkeypatch):
    project = fake_project(tmp_path, monkeypatch)
    _require(project, '["json"]')
    assert main(["ch42", "--solution"]) == 0


@pytest.mark.parametrize("value", ['"triton"', "[1]", '["not a name"]'])
def test_a_malformed_requires_is_a_registry_error(tmp_path, monkeypatch, value):
    project = fake_project(tmp_path, monkeypatch)
    _require(project, value)
    with pytest.raises(RegistryError, match="requires"):
        load_registry()


def test_every_required_package_is_an_extra_of_that_name():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    required = {m for c in load_registry().chapters.values() for m in c.requires}
    for m in required:
        assert m in extras, f"a chapter requires {m}, but pyproject.toml has no extra [{m}]"
        assert any(re.match(rf"{m}\b", dep) for dep in extras[m]), (m, extras[m])
