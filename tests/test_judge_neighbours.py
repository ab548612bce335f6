"""A learner's code runs in a copy of its target module's globals, with the public names of the
module's package neighbours added (judge/neighbours.py): the engine imports no name it does not use
only so that swapped-in code finds it."""

from __future__ import annotations

import sys
from types import ModuleType

from judge import swap
from judge.neighbours import neighbour_names
from judge.protocol import ExerciseSpec, SnippetSpec, UnitSpec

TARGET = "minisgl.scheduler.lifecycle:RequestLifecycle._free_req_resources"


def test_a_learners_method_may_name_a_class_only_a_neighbour_module_has():
    from minisgl.scheduler import ChunkedReq, lifecycle

    assert "ChunkedReq" not in vars(lifecycle), "lifecycle.py imports ChunkedReq again"
    cls = lifecycle.RequestLifecycle
    original = vars(cls)["_free_req_resources"]
    source = "def _free_req_resources(self, req):\n    return isinstance(req, ChunkedReq)\n"
    snippet = SnippetSpec("cell 1", source, "free_req_resources")
    exercise = ExerciseSpec("ch11.free_req_resources", "free_req_resources", TARGET, swap=True)
    unit = UnitSpec("ch11", "test", "reference", [snippet], [exercise])
    try:
        state = swap.apply([unit])
        assert not state.report.problems, state.report.problems
        got = cls._free_req_resources(None, ChunkedReq.__new__(ChunkedReq))
    finally:
        cls._free_req_resources = original
    assert got is True, f"isinstance(chunk, ChunkedReq) in lifecycle.py's namespace gave {got!r}"


def test_a_name_two_neighbours_hold_differently_is_not_given(monkeypatch):
    modules = {name: ModuleType(name) for name in ("pkg", "pkg.a", "pkg.b", "pkg.target")}
    modules["pkg.a"].Shared = modules["pkg.b"].Shared = object()
    modules["pkg.a"].Clash, modules["pkg.b"].Clash = object(), object()
    modules["pkg.a"].Own = modules["pkg.a"].exercise = modules["pkg.a"]._private = object()
    modules["pkg.target"].Own = "the target's own"
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    got = neighbour_names(modules["pkg.target"], keep_out={"exercise"})
    assert set(got) == {"Shared"}, (
        "expected only Shared (Clash: two objects; Own: the target has it; exercise: kept out; "
        f"_private), got {sorted(got)}"
    )
