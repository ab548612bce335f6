"""The exercise code the notebooks show, from the judge's registry and stub API (`judge/stubs.py`).

The judge owns how a stub is cut out of the reference and how the reference is extracted; this
tool only places the results in cells, so a stub in a notebook is exactly what the judge expects.
The registry is read once per run of the tool (a build asks for every exercise several times).
"""

from __future__ import annotations

import functools

from judge import stubs
from judge.registry import Exercise, Registry, load_registry


@functools.lru_cache(maxsize=None)
def _registry() -> Registry:
    return load_registry()


def info(chapter: str, name: str) -> Exercise:
    """The registry's entry; an unknown name raises KeyError listing the chapter's exercises."""
    return _registry().chapter(chapter).exercise(name)


def module_path(ex: Exercise) -> str:
    return ex.module.replace(".", "/") + ".py"


def stub_source(chapter: str, name: str) -> str:
    return stubs.stub_source(chapter, info(chapter, name))


def reference_source(chapter: str, name: str) -> str:
    return stubs.reference_source(chapter, info(chapter, name))
