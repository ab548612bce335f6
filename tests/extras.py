"""Tests that need an optional extra of pyproject.toml, which the README's set-up (`[workbook]`)
leaves out: triton (about 1 GB), or a client library only `[dev]` brings. Without it they are
skipped with a reason that names the install command, as the judge does for a chapter that
requires triton; CI runs the README's test command without them first, then these tests alone
(`pytest -m needs_extra`) after installing [dev].

- a test (or a parametrization) whose body needs the extra: `@needs_extra("triton")`, or
  `@needs_extra("dev", "langchain_openai")` when the extra's name is not the module's;
- a module whose imports need it: `pytestmark = module_needs_extra("triton")`, above those imports.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

import pytest

from judge.registry import install_command, missing_extras


def missing_reason(extra: str, modules: Sequence[str] = (), who: str = "") -> Optional[str]:
    """Why a test needing `extra` (the modules it installs; by default the module of its name)
    cannot run here, or None when they are all installed."""
    missing = missing_extras(modules or [extra])
    if not missing:
        return None
    needs = f"{who} need" if who else "needs"
    names = " and ".join(missing)
    return f"{needs} {names}, which is not installed here: {install_command([extra])}"


def needs_extra(extra: str, *modules: str) -> pytest.MarkDecorator:
    """Mark a test as needing this extra; conftest skips it, naming the install, without it."""
    return pytest.mark.needs_extra(extra, *modules)


def module_needs_extra(extra: str, *modules: str) -> pytest.MarkDecorator:
    """For a test module whose imports need the extra: skip the whole module here without it
    (its imports would fail), else return the marker for its `pytestmark`."""
    module = sys._getframe(1).f_globals.get("__file__", "this module")  # the skip's report names
    reason = missing_reason(extra, modules, who=f"the tests of {os.path.basename(module)}")
    if reason:
        pytest.skip(reason, allow_module_level=True)
    return needs_extra(extra, *modules)
