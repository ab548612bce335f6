"""The judge's report as a learner reads it: one short line per failed test (the test's own message,
or the comparison in brief, never a config's or a tensor's repr), counts and statuses that agree,
the learner's line shown only under the exercise it belongs to, a `--file` holding one function,
and a progress record that stays the notebook's.

Two more fake chapters, made here: ch44, a toy scheduler whose `run` admits and finishes requests
(exercises `run` and `finish`, sharing their tests as the engine's exercises do), and ch45, a layer
whose `named_tensors` must yield its tensors themselves (with torch, for real tensor values)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from judge.cli import main
from judge_fixtures import code_cell, fake_project, notebook, write_hints

SCHED = '''
from dataclasses import dataclass


@dataclass
class Config:
    model_path: str = "/a/long/path/to/the/model/directory/so/that/the/repr/of/the/config/is/long"
    max_running_req: int = 8
    notes: str = "a config with many fields, whose repr a learner should never have to read " * 3


class Scheduler:
    def __init__(self, config):
        self.config = config
        self.free = list(range(config.max_running_req))
        self.running = []

    def admit(self, uid):
        slot = self.free.pop()  # IndexError when no slot is left
        self.running.append((slot, uid))
        return slot

    def finish(self, slot, uid):
        """Give the slot of a finished request back."""
        self.running.remove((slot, uid))
        self.free.append(slot)

    def run(self, uids):
        """Admit each request, then finish it."""
        for uid in uids:
            slot = self.admit(uid)
            self.finish(slot, uid)
'''

LAYER = '''
import torch


class Layer:
    def __init__(self):
        self.weight = torch.zeros(4, 8, dtype=torch.bfloat16)

    def named_tensors(self):
        """Yield (name, tensor) for each weight: the tensors themselves, not copies."""
        for name, value in self.__dict__.items():
            if isinstance(value, torch.Tensor):
                yield name, value
'''

TESTS_44 = """
from fakepkg.sched import Config, Scheduler


def test_every_slot_comes_back():
    s = Scheduler(Config())
    s.run(range(3))
    lost = s.config.max_running_req - len(s.free)
    assert lost == 0, f"{lost} request slot(s) not returned after all requests ended"


def test_one_request_gives_its_slot_back():
    s = Scheduler(Config())
    s.run([0])
    assert len(s.free) == s.config.max_running_req


def test_more_requests_than_slots():
    s = Scheduler(Config())
    s.run(range(20))
"""

TESTS_45 = """
from fakepkg.layer import Layer


def test_weights_are_the_tensors_themselves():
    layer = Layer()
    assert dict(layer.named_tensors())["weight"] is layer.weight
"""

REGISTRY = """
[ch44]
title = "A fake scheduler"
test_files = ["fake_tests/test_fake44.py"]

[[ch44.exercises]]
name = "run"
target = "fakepkg.sched:Scheduler.run"
tests = ["test_fake44.py::test_every_slot_comes_back",
         "test_fake44.py::test_one_request_gives_its_slot_back",
         "test_fake44.py::test_more_requests_than_slots"]

[[ch44.exercises]]
name = "finish"
target = "fakepkg.sched:Scheduler.finish"
tests = ["test_fake44.py::test_every_slot_comes_back",
         "test_fake44.py::test_one_request_gives_its_slot_back",
         "test_fake44.py::test_more_requests_than_slots"]

[ch45]
title = "A fake layer"
test_files = ["fake_tests/test_fake45.py"]

[[ch45.exercises]]
name = "named_tensors"
target = "fakepkg.layer:Layer.named_tensors"
tests = ["test_fake45.py::test_weights_are_the_tensors_themselves"]
"""

RUN = """
def run(self, uids):
    for uid in uids:
        slot = self.admit(uid)
        self.finish(slot, uid)
"""
FINISH = """
def finish(self, slot, uid):
    self.running.remove((slot, uid))
    self.free.append(slot)
"""
FINISH_KEEPS_THE_SLOT = """
def finish(self, slot, uid):
    self.running.remove((slot, uid))  # forgets to give the slot back
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at 80 columns when not on a terminal
    p = fake_project(tmp_path, monkeypatch)
    (tmp_path / "fakepkg" / "sched.py").write_text(SCHED)
    (tmp_path / "fakepkg" / "layer.py").write_text(LAYER)
    (tmp_path / "fake_tests" / "test_fake44.py").write_text(TESTS_44)
    (tmp_path / "fake_tests" / "test_fake45.py").write_text(TESTS_45)
    with open(tmp_path / "registry.toml", "a") as f:
        f.write(REGISTRY)
    write_hints(tmp_path, "ch44", {"run": ["run hint"], "finish": ["finish hint"]})
    return p


def save_notebook(project, *sources):
    (project.notebooks / "ch44_sched.ipynb").write_text(
        notebook([code_cell(src, exercise=f"ch44.{name}") for name, src in sources])
    )


def judge_json(capsys, *argv):
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def report(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().out


def messages(verdict):
    return {
        t["test"].split("::")[-1]: t["message"]
        for t in verdict["tests"]
        if t["outcome"] != "passed"
    }


def exercises(verdict):
    return {e["name"]: e for e in verdict["exercises"]}


# ---------------------------------------------------------------------- one line per failure


def test_a_failed_assert_with_a_message_shows_that_message_alone(project, capsys):
    code, v = judge_json(
        capsys, "ch44", "--file", str(project.write("mine.py", RUN + FINISH_KEEPS_THE_SLOT))
    )
    assert code == 1, "a wrong finish must not pass"
    got = messages(v)["test_every_slot_comes_back"]
    assert got == "3 request slot(s) not returned after all requests ended", (
        f"message shown: {got!r}"
    )


def test_a_failed_assert_without_a_message_is_its_comparison_in_one_line(project, capsys):
    code, out = report(
        capsys, "ch44", "--file", str(project.write("mine.py", RUN + FINISH_KEEPS_THE_SLOT))
    )
    assert code == 1, "a wrong finish must not pass"
    assert "assert 7 == 8\n" in out, f"the bare assert is not shown as `assert 7 == 8`:\n{out}"
    assert "Config(" not in out and "where" not in out, (
        f"pytest's `where` lines with the config's repr:\n{out}"
    )
    assert len(out.splitlines()) < 25, (
        f"{len(out.splitlines())} lines of report for one wrong function"
    )


def test_a_tensor_is_shown_by_its_shape_and_dtype(project, capsys):
    copies = (
        "def named_tensors(self):\n    for k, v in self.__dict__.items():\n        yield "
        "k, v.clone()\n"
    )
    code, v = judge_json(capsys, "ch45", "--file", str(project.write("mine.py", copies)))
    assert code == 1, "named_tensors yielding copies must not pass"
    got = messages(v)["test_weights_are_the_tensors_themselves"]
    want = "assert tensor(shape=[4, 8], dtype=bfloat16) is tensor(shape=[4, 8], dtype=bfloat16)"
    assert got == want, f"message shown: {got!r}"


# ---------------------------------------------------------------------- counts and statuses agree


def test_an_exercise_correct_on_its_own_counts_every_test_it_passes(project, capsys):
    mine = str(project.write("mine.py", RUN + FINISH_KEEPS_THE_SLOT))
    code, v = judge_json(capsys, "ch44", "--file", mine)
    run, finish = exercises(v)["run"], exercises(v)["finish"]
    assert run["status"] == "passing" and run["alone"], "run is correct: its failures are finish's"
    assert (run["passed"], run["total"]) == (3, 3), (
        f"run passes {run['passed']}/{run['total']} of its tests"
    )
    assert (finish["status"], finish["passed"]) == ("failing", 0), (
        f"finish: {finish['status']}, {finish['passed']}/3"
    )
    code, out = report(capsys, "ch44", "--file", mine)
    row = next(line for line in out.splitlines() if line.startswith("run "))
    assert "passing on its own" in row and row.rstrip().endswith("3/3"), f"run's row: {row!r}"
    # the note under it names both measurements, so "3/3" and the failures do not contradict
    note = " ".join(out.split("✔ run:", 1)[1].split("\n\n", 1)[0].split())
    assert re.search(r"\d of its 3 tests failed in this run, as they also go through", note), note
    assert "rerun with the reference in place of" in note and "all 3 pass on its own" in note, note
    # the rows count each exercise's own tests, 6 for a run of 3: the report says why
    assert "counts in each of their rows" in out, "the table does not say that tests are shared"


def test_a_stub_and_its_row_say_the_same_count(project, capsys):
    from judge import stubs

    save_notebook(project, *[(name, stubs.stub_source("ch44", name)) for name in ("run", "finish")])
    # an untouched notebook runs no test (exit 0): asking for an exercise's tests runs them
    code, out = report(capsys, "ch44", "--exercise", "finish")
    assert code == 1, "stubs must not pass"
    # run's stub raises first, so finish's own NotImplementedError is never reached
    line = next(line for line in out.splitlines() if line.startswith("· finish"))
    assert "3 of its 3 test(s) fail" in line, f"finish's line disagrees with its 0/3 row: {line!r}"


# ---------------------------------------------------------------------- blame


def test_the_learner_line_is_shown_only_under_its_own_exercise(project, capsys):
    # with finish wrong, run (correct) hits the empty free list: the innermost learner line is run's
    mine = str(project.write("mine.py", RUN + FINISH_KEEPS_THE_SLOT))
    code, v = judge_json(capsys, "ch44", "--file", mine)
    raw = next(t for t in v["tests"] if t["test"].endswith("test_more_requests_than_slots"))
    assert "in run" in (raw["where"] or ""), f"the traceback's learner line: {raw['where']!r}"
    assert exercises(v)["finish"]["where"] == {}, (
        f"finish is blamed on: {exercises(v)['finish']['where']}"
    )
    code, out = report(capsys, "ch44", "--file", mine)
    assert "in your code" not in out, f"a line of run, which is correct, is shown:\n{out}"


def test_a_learner_line_in_a_helper_belongs_to_the_exercise_that_called_it(project, capsys):
    wrong = "def give_back(self, slot):\n    self.free.append(slot / 0)\n" + FINISH.replace(
        "self.free.append(slot)", "give_back(self, slot)"
    )
    code, v = judge_json(capsys, "ch44", "--file", str(project.write("mine.py", wrong)))
    where = exercises(v)["finish"]["where"]
    assert where and all("in give_back (called from finish)" in w for w in where.values()), (
        f"finish: {where}"
    )


def test_an_error_an_exercise_raises_is_said_as_the_rule_the_registry_words(project, capsys):
    registry = project.root / "registry.toml"
    rule = "a slot is given back once, by the uid that holds it"
    registry.write_text(
        registry.read_text().replace(
            'target = "fakepkg.sched:Scheduler.finish"',
            f'target = "fakepkg.sched:Scheduler.finish"\nraises = {{ ValueError = "{rule}" }}',
        )
    )
    swapped = FINISH.replace("(slot, uid)", "(uid, slot)")  # not in running: list.remove refuses
    code, v = judge_json(capsys, "ch44", "--file", str(project.write("mine.py", swapped)))
    got = messages(v)
    assert got and all(m.startswith("finish raised ValueError") for m in got.values()), got
    assert all(rule in m for m in got.values()), f"the rule is missing: {got}"
    wrong_kind = "def finish(self, slot, uid):\n    raise KeyError(uid)\n"  # no rule worded
    code, v = judge_json(capsys, "ch44", "--file", str(project.write("other.py", wrong_kind)))
    assert all(rule not in m for m in messages(v).values()), messages(v)


# ---------------------------------------------------------------------- where to ask for hints


def test_stuck_says_how_to_ask_for_hints_where_the_learner_is(project, capsys):
    save_notebook(project, ("run", RUN), ("finish", FINISH_KEEPS_THE_SLOT))
    code, out = report(capsys, "ch44")
    assert "`python judge.py ch44 --hint`" in out, f"terminal:\n{out}"
    from judge.live import check

    namespace = {"__name__": "__main__"}
    _define(namespace, RUN + FINISH_KEEPS_THE_SLOT)
    check("ch44", namespace=namespace)
    out = capsys.readouterr().out
    assert '`judge.check("ch44", hint=1)`' in out and "python judge.py" not in out, (
        f"notebook:\n{out}"
    )


def _define(namespace, source):
    """As a Jupyter cell does: run the source with its text where inspect.getsource finds it."""
    import linecache

    name = f"<ipython-input-{len(linecache.cache)}>"
    source = textwrap.dedent(source)
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)


# ---------------------------------------------------------------------- --file with one function


def test_a_file_with_one_function_keeps_the_others_as_the_reference(project, capsys):
    code, out = report(
        capsys, "ch44", "--file", str(project.write("mine.py", FINISH_KEEPS_THE_SLOT))
    )
    assert code == 1, "a wrong finish must not pass"
    row = next(line for line in out.splitlines() if line.startswith("run "))
    assert "reference: not in your file" in row and row.rstrip().endswith("-"), (
        f"run's row: {row!r}"
    )
    assert "not in your file, so the reference stayed in place: run" in out, (
        f"no line under the table:\n{out}"
    )
    code, v = judge_json(
        capsys, "ch44", "--file", str(project.write("mine.py", FINISH_KEEPS_THE_SLOT))
    )
    assert exercises(v)["run"]["status"] == "reference", "run is not in the file"


def test_a_file_with_none_of_the_exercises_is_a_usage_error(project, capsys):
    code = main(
        ["ch44", "--file", str(project.write("mine.py", FINISH.replace("def finish", "def finsh")))]
    )
    err = capsys.readouterr().err
    assert code == 2, f"exit status {code} for a file with no exercise of the chapter"
    assert "defines none of ch44's exercises" in err and "there is a `def finsh`" in err, (
        f"message: {err}"
    )


# ---------------------------------------------------------------------- progress (issue 16)


def test_a_file_run_does_not_overwrite_the_notebooks_progress(project, capsys):
    save_notebook(project, ("run", RUN), ("finish", FINISH))
    assert main(["ch44"]) == 0, "the notebook is correct"
    code, out = report(
        capsys, "ch44", "--file", str(project.write("mine.py", FINISH_KEEPS_THE_SLOT))
    )
    assert code == 1 and out.rstrip().endswith("not recorded in your progress: judged a file"), out[
        -300:
    ]
    _the_notebook_still_passes(capsys)


def test_a_live_check_then_a_file_run_keeps_the_live_standing(project, capsys):
    from judge.live import check

    namespace = {"__name__": "__main__"}
    _define(namespace, RUN + FINISH)
    save_notebook(project, ("run", RUN), ("finish", FINISH))  # the same code, saved
    assert check("ch44", namespace=namespace).passed, "the live notebook is correct"
    assert main(["ch44", "--file", str(project.write("mine.py", FINISH_KEEPS_THE_SLOT))]) == 1
    _the_notebook_still_passes(capsys)


def _the_notebook_still_passes(capsys):
    capsys.readouterr()
    main([])
    row = next(
        line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("ch44")
    )
    assert "2/2" in row, f"the progress table lost the notebook's standing: {row!r}"
    code, v = judge_json(capsys, "ch44", "--hint")
    assert v["hints"] == {}, f"hints for exercises that pass in the notebook: {sorted(v['hints'])}"


def test_hints_come_from_the_source_being_judged(project, capsys):
    save_notebook(project, ("run", RUN), ("finish", FINISH))
    assert main(["ch44"]) == 0, "the notebook is correct"
    capsys.readouterr()
    # a file's run is not recorded: its exercises may still be wrong, the others are not its own
    code, v = judge_json(
        capsys, "ch44", "--file", str(project.write("mine.py", FINISH_KEEPS_THE_SLOT)), "--hint"
    )
    assert sorted(v["hints"]) == ["ch44.finish"], f"hints for the file: {sorted(v['hints'])}"
    # the notebook changed since it passed: that exercise may be wrong now
    save_notebook(project, ("run", RUN), ("finish", FINISH_KEEPS_THE_SLOT))
    code, v = judge_json(capsys, "ch44", "--hint")
    assert sorted(v["hints"]) == ["ch44.finish"], (
        f"hints for the edited notebook: {sorted(v['hints'])}"
    )


def test_tests_not_run_for_one_reason_are_said_once():
    """After an exercise times out its other tests are not run; the report says so once, not once
    each."""
    from rich.console import Console

    from judge.report import _test_lines
    from judge.runner import TestResult

    why = "not run: step already timed out in test_a"
    tests = [
        TestResult(
            "t.py::test_a", "timeout", message="the test did not finish within its time budget"
        )
    ]
    tests += [TestResult(f"t.py::test_{n}", "error", message=why) for n in "bcd"]
    console = Console(record=True, width=200)
    _test_lines(tests, console, verbose=False, where=lambda t: None)
    out = console.export_text()
    assert out.count(why) == 1 and "3 more test(s) not run: step already timed out" in out, out
    assert "test_a" in out and "test_b" not in out, out


# ---------------------------------------------------------------------- Triton's refusals


def _interpreted(monkeypatch, name: str):
    """tests/data/NAME.py's Triton kernels, decorated under Triton's interpreter."""
    pytest.importorskip("triton")
    import importlib.util

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when a kernel is decorated
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).parent / "data" / f"{name}.py"
    )
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    return kernels


def _judges_message(launch) -> str:
    """The judge's failure message for the error `launch()` raises."""
    from judge.failure_messages import describe

    with pytest.raises(Exception) as info:
        launch()
    return describe(info, None)["message"]


def test_a_running_state_returned_in_bf16_is_named_by_the_engines_math_refusal(monkeypatch):
    # Triton's interpreter: InterpreterError("ValueError(\"Expected dtype ['fp32', 'fp64'] but got
    # bf16\")") from the kernel's tl.log after the loop; the judge's line names the call, the
    # dtype, which returned value had it and the float32-state rule (classroom/kernel_errors)
    import torch

    mine = _interpreted(monkeypatch, "running_state_returned_in_bf16")
    said = _judges_message(lambda: mine.lse[(1,)](torch.ones(8), torch.zeros(1), 8))
    assert said.startswith("ValueError: the engine's lse calls tl.log"), said
    for words in ("takes fp32 or fp64 only", "given bf16", "returned l_i in bf16", "float32"):
        assert words in said, f"{words!r} not in {said!r}"
    # a step that returns l_i as [M, 1]: the kernel's store refuses a [M, M, N] tile of values
    said = _judges_message(lambda: mine.normalised[(1,)](torch.ones(4, 8), torch.zeros(4, 8), 4, 8))
    assert (
        "tl.store was given values of shape [4, 4, 8] for a tile of pointers of shape [4, 8]"
        in (said)
    ), said
    assert "returned m_i [4], l_i [4, 1], acc [4, 8]" in said, said


def test_a_triton_refusal_in_a_learners_kernel_is_said_as_the_rule_it_breaks(tmp_path, monkeypatch):
    # Triton's interpreter: InterpreterError("ValueError('Cannot make_shape_compatible: ...')");
    # the judge's line names the tl call, both shapes and the mask's rule (classroom/kernel_errors)
    import torch

    mine = _interpreted(monkeypatch, "mask_on_the_wrong_axis")
    said = _judges_message(lambda: mine.copy[(1,)](torch.ones(8, 16), torch.zeros(8, 16), 5, 8, 16))
    assert said.startswith(
        "ValueError: tl.load was given a [8, 16] tile of pointers and a [1, 8] mask"
    ), said
    assert "a mask has the shape of the tile it guards" in said, said


def test_a_scheduler_mixins_name_is_said_as_the_scheduler():
    # The Scheduler is built from one mixin a chapter: a TypeError from `self._process_last_data()`
    # names SpeculativeSteps (chapter 24) in a chapter-7 message unless it is said as the scheduler
    import minisgl.scheduler  # noqa: F401  (the names are the loaded Scheduler's mixins)
    from classroom.engine_names import in_learner_terms

    said = "SpeculativeSteps._process_last_data() missing 1 required positional argument"
    assert in_learner_terms(said) == (
        "Scheduler._process_last_data() missing 1 required positional argument"
    )
    assert in_learner_terms("SamplingParams.__init__() got an unexpected keyword") == (
        "SamplingParams.__init__() got an unexpected keyword"
    ), "a class that is not one of the scheduler's mixins keeps its name"
