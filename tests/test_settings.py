"""Every MINISGL_* variable is defined once, with its allowed values (minisgl/env.py,
judge/settings.py), and the README lists them as they are defined."""

import re
from pathlib import Path

import pytest

from judge import settings as judge_settings
from minisgl import env
from tools import settings_table

REPO = Path(__file__).resolve().parent.parent
# Where a variable may be read or mentioned: the code, its tests, the docs, CI.
SCANNED = ["minisgl", "judge", "tools", "tests", "benchmarks", "chapters", "README.md", ".ci"]
NAME = re.compile(r"\bMINISGL_[A-Z0-9_]*[A-Z0-9]\b")
DEFINED = {s.name for s in env.SETTINGS + judge_settings.SETTINGS}


def _mentions(root: Path):
    for entry in SCANNED:
        path = root / entry
        for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            if f.suffix in (".py", ".md", ".sh", ".toml", "") and "__pycache__" not in f.parts:
                for name in NAME.findall(f.read_text(encoding="utf-8", errors="replace")):
                    yield f.relative_to(root), name


def test_every_minisgl_variable_mentioned_anywhere_is_defined():
    unknown = sorted({(str(f), n) for f, n in _mentions(REPO) if n not in DEFINED})
    assert not unknown, (
        f"{len(unknown)} MINISGL_* name(s) not defined in minisgl/env.py or judge/settings.py, "
        f"first: {unknown[0][1]} in {unknown[0][0]}"
    )


def test_the_readme_lists_the_settings_as_defined():
    block = settings_table.readme_block(settings_table.README.read_text(encoding="utf-8"))
    assert block == settings_table.table(), (
        "README.md's table of settings differs from their definitions: run `python -m "
        "tools.settings_table --write`"
    )


@pytest.mark.parametrize(
    "setting",
    [s for s in env.SETTINGS + judge_settings.SETTINGS if s.allowed],
    ids=lambda s: s.name,
)
def test_a_value_outside_the_allowed_ones_is_an_error_naming_the_variable_and_the_values(setting):
    with pytest.raises(env.SettingError) as e:
        setting.parse("bogus")
    assert setting.name in str(e.value) and setting.allowed[-1] in str(e.value), (
        f"the error should name {setting.name} and its values, it said: {e.value}"
    )
    assert setting.parse(None) == setting.parse(setting.default), "unset should mean the default"
