"""The judge accepts a correct saved notebook: every chapter's solution notebook, read from its
file as `python judge.py chNN --notebook solutions/...` reads a learner's.

The judge runs a notebook's exercise and support cells in the namespace of every module the
chapter's exercises go into (judge/swap.py). Every global name a function of those cells reads must
then resolve there, from the module itself, the cells, or the imports the judge carries from the
notebook's other cells (judge/sources.py) — checked here for every chapter without running its
tests (seconds). `python judge.py --selfcheck` (CI) then judges every solution notebook in full;
chapter 13's, the one that was rejected (`REPLACEMENT`), is judged here too.
"""

from __future__ import annotations

import builtins
import dis
import importlib
import json
import types
from pathlib import Path

import pytest

from extras import needs_extra
from judge.cli import main
from judge.registry import load_registry
from judge.sources import from_notebook

REPO = Path(__file__).resolve().parent.parent
REGISTRY = load_registry(REPO / "judge" / "exercises.toml")
NOTEBOOKS = {key: next((REPO / "solutions").glob(f"{key}_*.ipynb")) for key in REGISTRY.chapters}


def _global_reads(code: types.CodeType) -> set:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_reads(const)
    return names


def _functions(namespace: dict, labels: set):
    """The functions (and methods of classes) the notebook's cells defined in `namespace`."""
    for name, value in namespace.items():
        items = vars(value).items() if isinstance(value, type) else [(name, value)]
        for attr, member in items:
            member = getattr(member, "fget", None) or getattr(member, "__func__", member)
            if isinstance(member, types.FunctionType) and member.__code__.co_filename in labels:
                yield f"{name}.{attr}" if isinstance(value, type) else name, member


# a chapter that requires an extra (triton for 17 and 19) imports it in its target modules
@pytest.mark.parametrize(
    "key",
    [
        pytest.param(k, marks=[needs_extra(x) for x in c.requires])
        for k, c in REGISTRY.chapters.items()
    ],
)
def test_every_name_the_cells_read_resolves_in_every_target_module(key):
    chapter = REGISTRY.chapter(key)
    code = from_notebook(NOTEBOOKS[key], chapter)
    assert not code.problems and not code.general_problems, (code.problems, code.general_problems)
    labels = {s.label for s in code.snippets}
    homes = {ex.attr: ex.module for ex in chapter.exercises if "." not in ex.target.split(":")[1]}
    unresolved = []
    for module_name in sorted({ex.module for ex in chapter.exercises}):
        namespace = dict(vars(importlib.import_module(module_name)))
        for snip in code.snippets:
            exec(compile(snip.source, snip.label, "exec"), namespace)
        for name, fn in _functions(namespace, labels):
            if homes.get(name, module_name) != module_name:
                continue  # another module's exercise: the judge binds that module's one here
            missing = sorted(
                n
                for n in _global_reads(fn.__code__)
                if n not in namespace and not hasattr(builtins, n)
            )
            unresolved += [f"{name} in {module_name}: {', '.join(missing)}"] if missing else []
    assert not unresolved, f"names that do not resolve where the judge runs them: {unresolved}"


def test_the_chapter_13_solution_notebook_is_judged_green(tmp_path, monkeypatch, capsys):
    """It was rejected: `next_text` read `REPLACEMENT` (imported in the set-up cell) in
    tokenize.py's namespace, and the report blamed `detokenize`."""
    monkeypatch.setenv("MINISGL_JUDGE_PROGRESS", str(tmp_path / "progress.json"))
    rc = main(["ch13", "--notebook", str(NOTEBOOKS["ch13"]), "--json"])
    verdict = json.loads(capsys.readouterr().out)
    failed = [f"{t['test']}: {t['message']}" for t in verdict["tests"] if t["outcome"] != "passed"]
    assert rc == 0 and not failed, failed
    assert {e["status"] for e in verdict["exercises"]} == {"passing"}
