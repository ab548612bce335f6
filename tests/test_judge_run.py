"""The judge end to end on a fake chapter (ch42, see judge_fixtures.py): learner code is swapped
into a tiny package and its tests run in a subprocess, so every run takes about a second.

Each learner file below breaks the exercises in independent ways at once, so one run checks several
of the ways learner code can go wrong."""

from __future__ import annotations

import json
import os
import sys
from typing import Dict

import pytest

from judge.cli import main
from judge_fixtures import SOLUTION, code_cell, fake_project, notebook


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at 80 columns when not on a terminal
    return fake_project(tmp_path, monkeypatch)


def judge_json(capsys, *argv):
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def by_test(verdict):
    return {t["test"].split("::")[-1]: t for t in verdict["tests"]}


def by_exercise(verdict):
    return {e["name"]: e for e in verdict["exercises"]}


def test_a_correct_solution_passes_and_is_recorded(project, capsys):
    (project.notebooks / "ch42_fake.ipynb").write_text(
        notebook([code_cell(SOLUTION, exercise="ch42.double")])
    )
    code, v = judge_json(capsys, "ch42")
    assert code == 0 and v["passed"]
    assert {e["status"] for e in v["exercises"]} == {"passing"}
    assert v["counts"] == {"passed": 7}
    # property and classmethod were re-applied; `double` reached the module that imported it
    assert (
        by_test(v)["test_is_big"]["outcome"] == by_test(v)["test_quadruple"]["outcome"] == "passed"
    )
    progress = json.loads(project.progress.read_text())["chapters"]["ch42"]
    assert progress["passed"] and progress["exercises"]["double"] == "passing"


def test_module_level_swap_reaches_every_importer(project, capsys):
    wrong = SOLUTION.replace("return x * SCALE", "return x * 3")
    code, v = judge_json(capsys, "ch42", "--file", str(project.write("mine.py", wrong)))
    assert code == 1
    tests = by_test(v)
    # fakepkg.user imported `double` before the swap... and the test module imported it after
    assert tests["test_quadruple"]["outcome"] == tests["test_double"]["outcome"] == "failed"
    assert "assert 9 == 6" in tests["test_double"]["message"]
    assert by_exercise(v)["double"]["status"] == "failing"
    assert by_exercise(v)["bump"]["status"] == "passing"


def test_a_test_shared_by_two_exercises_blames_the_wrong_one(project, capsys):
    # test_is_big judges both is_big and starting_at; only starting_at is wrong here
    wrong = SOLUTION.replace("    c.n = n\n", "    c.n = 0\n")
    assert wrong != SOLUTION
    code, v = judge_json(capsys, "ch42", "--file", str(project.write("mine.py", wrong)))
    assert code == 1 and not v["passed"]
    exercises = by_exercise(v)
    assert by_test(v)["test_is_big"]["outcome"] == "failed"
    assert exercises["starting_at"]["status"] == "failing"
    assert exercises["is_big"]["status"] == "passing"
    assert "correct on its own" in exercises["is_big"]["note"]


def _stub_cells(written: Dict[str, str] | None = None):
    from judge import stubs

    written = written or {}
    cells = [
        code_cell(
            written.get(e.name, stubs.stub_source("ch42", e.name)) + "\nprint('try-out')\n",
            exercise=f"ch42.{e.name}",
        )
        for e in stubs.exercises("ch42")
    ]
    cells.insert(0, code_cell("import nothing_like_this  # scratch: never run by the judge"))
    return cells


def test_an_untouched_notebook_exits_0_and_says_what_to_do_next(project, capsys, monkeypatch):
    """A fresh clone's notebook is not failing code: exit 0, no test run, and the next step."""
    (project.notebooks / "ch42_fake.ipynb").write_text(notebook(_stub_cells()))
    code, v = judge_json(capsys, "ch42")
    assert code == 0 and v["not_started"] is True
    assert {e["status"] for e in v["exercises"]} == {"not attempted"}
    assert v["tests"] == []
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["ch42"]) == 0
    out = capsys.readouterr().out
    # output to a pipe or a file is not wrapped at 80 columns (it would cut test ids)
    assert any("1. open" in line and "at once" in line for line in out.splitlines()), out
    assert "Not attempted yet" in out and "open notebooks/ch42_fake.ipynb" not in out  # not cwd
    assert "ch42_fake.ipynb" in out and "python judge.py ch42 --solution" in out, out


def test_a_run_of_stubs_alone_shows_as_stubs_in_the_progress_table(project, capsys, monkeypatch):
    (project.notebooks / "ch42_fake.ipynb").write_text(notebook(_stub_cells()))
    assert main(["ch42"]) == 0
    assert "not attempted" in capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "200")
    assert main([]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "ch42" in line)
    passing, last = row.split("A fake chapter")[-1].split()[1:3]
    assert passing == "-" and last == "stubs", (
        f"after a run of stubs alone the table should say so, not show 0/N passing: {row!r}"
    )


def test_stubs_beside_an_attempted_exercise_are_not_attempted(project, capsys):
    """Once one exercise is written, the chapter is judged: its stubs fail with their sentinels,
    and the exit status is 1 (a teacher's CI sees an unfinished chapter)."""
    bump = "def bump(self, by=1):\n    self.n += by\n"
    (project.notebooks / "ch42_fake.ipynb").write_text(notebook(_stub_cells({"bump": bump})))
    code, v = judge_json(capsys, "ch42")
    assert code == 1
    status = {e["name"]: e["status"] for e in v["exercises"]}
    assert status.pop("bump") == "passing"
    assert set(status.values()) == {"not attempted"}
    tests = by_test(v)
    assert tests["test_double"]["sentinel"] == "ch42.double"
    assert tests["test_starting_at"]["sentinel"] == "ch42.starting_at"
    assert tests["test_unrelated"]["outcome"] == "passed"


def test_exit_exception_and_endless_loop(project, capsys):
    src = """
    import sys

    def double(x):
        sys.exit(3)

    def bump(self, by=1):
        while True:
            pass

    def is_big(self):
        return self.n > 10

    def starting_at(cls, n):
        raise ValueError("boom")
    """
    code, v = judge_json(
        capsys, "ch42", "--file", str(project.write("mine.py", src)), "--timeout", "2"
    )
    assert code == 1
    tests = by_test(v)
    assert (
        tests["test_double"]["outcome"] == "failed"
        and "SystemExit: 3" in tests["test_double"]["message"]
    )
    assert tests["test_bump"]["outcome"] == "timeout"
    assert tests["test_starting_at"]["message"] == "ValueError: boom"
    assert tests["test_starting_at"]["where"].endswith(
        'line 15, in starting_at: raise ValueError("boom")'
    )
    assert tests["test_unrelated"]["outcome"] == "passed"  # the run went on after all of it


def test_os_exit_wrong_signature_and_megabytes_of_output(project, capsys):
    src = """
    import os

    def double(x):
        print("spam" * 5_000_000)  # 20 MB
        return x * SCALE

    def bump(self):
        self.n += 1

    def is_big(self):
        os._exit(7)

    def starting_at(cls, n):
        c = cls()
        c.n = n
        return c
    """
    code, v = judge_json(capsys, "ch42", "--file", str(project.write("mine.py", src)))
    assert code == 1
    ex, tests = by_exercise(v), by_test(v)
    assert ex["double"]["status"] == "passing"
    assert ex["bump"]["status"] == "error"
    assert (
        ex["bump"]["problem"]
        == "wrong signature: expected `def bump(self, by=1)`, got `def bump(self)`"
    )
    assert (
        tests["test_is_big"]["outcome"] == "crashed"
        and "exit status 7" in tests["test_is_big"]["message"]
    )
    assert tests["test_starting_at"]["outcome"] == "passed"  # run in a restarted process
    assert tests["test_unrelated"]["outcome"] == "passed"


def test_a_name_error_while_loading_and_a_missing_function(project, capsys):
    src = """
    @no_such_decorator
    def double(x):
        return x * SCALE

    def bump_it(self, by=1):
        self.n += by
    """
    code, v = judge_json(capsys, "ch42", "--file", str(project.write("mine.py", src)))
    assert code == 1
    ex = by_exercise(v)
    assert "NameError: name 'no_such_decorator' is not defined at line 2" in ex["double"]["problem"]
    # a file may leave exercises out (they stay the reference), but a near miss is pointed out
    assert ex["bump"]["status"] == "reference" and "there is a `def bump_it`" in ex["bump"]["note"]
    assert ex["double"]["status"] == "error"


def test_a_file_that_does_not_parse_runs_no_test(project, capsys):
    code, v = judge_json(
        capsys, "ch42", "--file", str(project.write("mine.py", "def double(x):\nreturn x\n"))
    )
    assert code == 1 and v["tests"] == []
    assert "syntax error" in by_exercise(v)["double"]["problem"]


def test_the_human_report(project, capsys):
    wrong = SOLUTION.replace("return x * SCALE", "return x * 3").replace(
        "self.n += by", "self.n += by / 0"
    )
    assert main(["ch42", "--file", str(project.write("mine.py", wrong))]) == 1
    out = capsys.readouterr().out
    assert "✘ failing" in out and "assert 9 == 6" in out and "NOT PASSED: 3/7 tests passed" in out
    assert "ZeroDivisionError: division by zero" in out
    assert "in your code: " in out and "line 7, in bump: self.n += by / 0" in out
    assert "return x * SCALE" not in out  # never the reference


@pytest.mark.parametrize(
    "argv,message",
    [
        (["ch12"], "unknown chapter 'ch12'"),
        (["ch42"], "no notebook for ch42"),
        (["ch42", "--file", "nope.py"], "file not found"),
        (["ch42", "--exercise", "triple"], "ch42 has no exercise 'triple'"),
        (["ch42", "--variant", "nope"], "no variant 'nope' for ch42"),
    ],
)
def test_bad_requests_exit_2_with_one_line(project, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_corrupt_notebook_exits_2(project, capsys):
    (project.notebooks / "ch42_fake.ipynb").write_text('{"cells": [')
    assert main(["ch42"]) == 2
    assert "not a valid notebook: broken JSON" in capsys.readouterr().err


def test_selection_by_exercise_and_keyword(project, capsys):
    mine = str(project.write("mine.py", SOLUTION))
    code, v = judge_json(capsys, "ch42", "--file", mine, "--exercise", "starting_at")
    assert code == 0 and sorted(by_test(v)) == ["test_is_big", "test_starting_at"]
    code, v = judge_json(capsys, "ch42", "--file", mine, "-k", "bump or unrelated")
    assert code == 0 and sorted(by_test(v)) == ["test_bump", "test_unrelated"]
    # a filtered run judges part of the chapter: the progress file is not told the chapter passed
    broken = str(project.write("broken.py", SOLUTION.replace("self.n += by", "self.n -= by")))
    code, v = judge_json(capsys, "ch42", "--file", broken, "-k", "double or unrelated")
    assert code == 0 and not project.progress.exists()
    code, v = judge_json(capsys, "ch42", "--file", broken, "--exercise", "double")
    assert code == 0 and not project.progress.exists()


def test_progress_table_and_hints(project, capsys):
    (project.notebooks / "ch42_fake.ipynb").write_text(
        notebook([code_cell(SOLUTION.replace("n > 10", "n > 11"), exercise="ch42.is_big")])
    )
    assert main(["ch42"]) == 1
    capsys.readouterr()
    assert main([]) == 0
    table = capsys.readouterr().out
    # test_is_big also judges starting_at, which the rerun with only it swapped in clears: 3 of 4
    # pass
    assert "ch42" in table and "A fake chapter" in table and "3/4" in table
    assert main(["ch42", "--hint"]) == 0
    out = capsys.readouterr().out
    # only unfinished ones
    assert "Hints for ch42.is_big" in out and "Hints for ch42.double" not in out
    code, v = judge_json(capsys, "ch42", "--hint")
    # the same ones
    assert code == 0 and "ch42.is_big" in v["hints"] and "ch42.double" not in v["hints"]
    assert main(["ch42", "--hint", "--hint", "--exercise", "double"]) == 0
    out = capsys.readouterr().out
    assert "1. first hint" in out and "2. second hint" in out and "third hint" not in out
    assert main(["ch42", "--hint", "3", "--exercise", "double"]) == 0
    assert "3. third hint" in capsys.readouterr().out


def test_variants_are_caught_or_not(project, capsys):
    (project.variants / "ch42_triple.py").write_text(
        '"""Triples instead of doubling."""\n# whole function: a test of the .py form\n\n'
        "def double(x):\n    return 3 * x\n"
    )
    (project.variants / "ch42_harmless.diff").write_text(
        "Adds instead of multiplying: the same.\n\n"
        "@@ double\n-    return x * SCALE\n+    return x + x\n"
    )
    assert main(["ch42", "--variant", "list"]) == 0
    assert "triple: Triples instead of doubling." in capsys.readouterr().out
    code, out = judge_json(capsys, "ch42", "--variant", "triple")
    assert code == 0 and out["caught"]
    assert sorted(t.split("::")[-1] for t in out["variants"][0]["caught_by"]) == [
        "test_double",
        "test_quadruple",
        "test_total",
    ]
    code, out = judge_json(capsys, "ch42", "--variant", "harmless")
    assert code == 1 and not out["caught"]
    assert not project.progress.exists()  # only the learner's own runs are recorded


def test_selfcheck_proves_the_fake_chapter(project, capsys):
    (project.variants / "ch42_triple.diff").write_text(
        "Triples.\n\n@@ double\n-    return x * SCALE\n+    return 3 * x\n"
    )
    assert main(["--selfcheck", "ch42"]) == 0
    out = capsys.readouterr().out
    assert "selfcheck passed" in out


def test_selfcheck_counts_a_variant_that_kills_the_test_process_as_caught(
    project, capsys, monkeypatch
):
    """As a stream race does on a GPU (an illegal address ends the process): the tests it was in
    fail, which is what the check asks of a variant; the run's note that the process died too
    often is reported beside them, not held against the check."""
    import judge.runner

    monkeypatch.setattr(judge.runner, "MAX_RESTARTS", 1)  # three tests call double: 3 deaths > 2
    (project.variants / "ch42_exits.diff").write_text(
        "Ends the process.\n\n@@ double\n-    return x * SCALE\n+    import os\n+    os._exit(3)\n"
    )
    assert main(["--selfcheck", "ch42", "--workers", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "selfcheck passed" in out and "ok ch42 variant exits" in out


def test_selfcheck_names_registry_mistakes(project, capsys):
    registry = project.root / "registry.toml"
    text = registry.read_text().replace(
        'tests = ["test_fake.py::test_bump"]', 'tests = ["test_fake.py::test_unrelated"]'
    )
    registry.write_text(text)
    assert main(["--selfcheck", "ch42", "--workers", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "listed for ch42.bump but pass with its stub (drop them from its tests): "
        "test_fake.py::test_unrelated" in out
    )
    assert (
        "fail with the stub of ch42.bump but are not in its tests (add them): "
        '"test_fake.py::test_bump"' in out
    )


def test_live_check_judges_the_notebook_namespace(project, capsys):
    """As in a Jupyter kernel: functions defined in cells, whose source IPython keeps in
    linecache."""
    import linecache

    from judge.live import check

    namespace = {"__name__": "__main__"}
    cells = [
        "FACTOR = 2\n\ndef helper(x):\n    return x * FACTOR\n",
        "def double(x):\n    return helper(x)\n",
        "def bump(self, by=1):\n    self.n += by\n",
    ]
    for i, src in enumerate(cells):
        name = f"<ipython-input-{i}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        exec(compile(src, name, "exec"), namespace)
    shown = check("ch42", namespace=namespace)
    assert "not passed, 5/7 tests" in repr(shown)
    ex = {e.name: e for e in shown.verdict.exercises}
    assert ex["double"].status == ex["bump"].status == "passing"  # helper and FACTOR came along
    assert ex["is_big"].status == "error" and "no `def is_big(...)` found" in ex["is_big"].problem
    assert "ch42" in json.loads(project.progress.read_text())["chapters"]


def test_live_check_of_a_notebook_still_all_stubs_runs_no_test(project, capsys, monkeypatch):
    """As the notebook's last cell runs on a fresh clone: what to do next, at once, like
    `python judge.py` (chapter 14's stubs kept its servers waiting a minute for their timeouts)."""
    import linecache

    import judge.judging
    from judge import stubs
    from judge.live import check

    runs, real = [], judge.judging.run_pytest
    monkeypatch.setattr(judge.judging, "run_pytest", lambda *a: runs.append(a) or real(*a))
    namespace = {"__name__": "__main__"}

    def run_cell(src: str) -> None:  # as IPython does: the source in linecache, then exec
        name = f"<ipython-input-{len(linecache.cache)}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        exec(compile(src, name, "exec"), namespace)

    for e in stubs.exercises("ch42"):
        run_cell(stubs.stub_source("ch42", e.name))
    shown = check("ch42", namespace=namespace)
    assert {e.status for e in shown.verdict.exercises} == {"not attempted"} and not runs
    out = " ".join(capsys.readouterr().out.split())
    assert "no test was run" in out and "run this cell again" in out
    assert "ch42" in json.loads(project.progress.read_text())["chapters"]
    check("ch42", namespace=namespace, hint=1)  # hints still need no test
    out = " ".join(capsys.readouterr().out.split())
    assert "no test was run" in out and "Hints for ch42.double" in out and not runs
    # one exercise written: the chapter is judged (its stubs fail with their sentinels)
    run_cell("def double(x):\n    return x * SCALE\n")
    shown = check("ch42", namespace=namespace)
    assert runs and {e.name: e.status for e in shown.verdict.exercises}["double"] == "passing"


def test_cumulative_swaps_in_every_chapter_up_to_this_one(project, capsys):
    (project.notebooks / "ch42_fake.ipynb").write_text(
        notebook(
            [code_cell(SOLUTION.replace("self.n += by", "self.n -= by"), exercise="ch42.double")]
        )
    )
    (project.notebooks / "ch43_more.ipynb").write_text(
        notebook(
            [
                code_cell(
                    "def total(xs):\n    return sum(double(x) for x in xs)\n", exercise="ch43.total"
                )
            ]
        )
    )
    code, v = judge_json(capsys, "ch43")
    assert code == 0 and v["chapters"] == ["ch43"]  # ch42 stays the reference
    code, v = judge_json(capsys, "ch43", "--cumulative")
    assert code == 1 and v["chapters"] == ["ch42", "ch43"]
    status = {e["id"]: e["status"] for e in v["exercises"]}
    assert status == {
        "ch42.double": "passing",
        "ch42.bump": "failing",
        "ch42.is_big": "passing",
        "ch42.starting_at": "passing",
        "ch43.total": "passing",
    }
    assert len(v["tests"]) == 9
    chapters = json.loads(project.progress.read_text())["chapters"]
    # each chapter its own verdict
    assert not chapters["ch42"]["passed"] and chapters["ch43"]["passed"]


def test_live_check_in_a_real_ipython_shell(project, capsys):
    """`judge.check` called from a cell finds the cell-defined functions in the shell's
    namespace."""
    ipython = pytest.importorskip("IPython.core.interactiveshell")
    shell = ipython.InteractiveShell.instance()
    try:
        for cell in [SOLUTION, "import judge\nshown = judge.check('ch42')"]:
            assert shell.run_cell(cell).success
        assert shell.user_ns["shown"].passed
    finally:
        ipython.InteractiveShell.clear_instance()
    assert "PASSED: 7/7 tests passed" in capsys.readouterr().out


def test_an_endless_loop_while_loading_hits_the_time_limit(project, capsys):
    src = "class Spin:\n    while True:\n        pass\n" + SOLUTION
    code, v = judge_json(
        capsys, "ch42", "--file", str(project.write("mine.py", src)), "--time-limit", "3"
    )
    assert code == 1 and not v["passed"]
    assert any("time limit of 3 s" in g and "while loading your code" in g for g in v["general"])


def test_the_judge_writes_nothing_but_its_progress_file(project, capsys):
    nb = project.notebooks / "ch42_fake.ipynb"
    nb.write_text(notebook([code_cell(SOLUTION, exercise="ch42.double")]))
    before = {p for p in project.root.rglob("*")}
    assert main(["ch42"]) == 0
    assert main(["ch42", "--file", str(project.write("mine.py", SOLUTION))]) == 0
    after = {p for p in project.root.rglob("*")}
    assert after - before == {project.root / "mine.py", project.progress}


def test_judge_py_entry_point(project):
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "judge.py", "ch42", "--file", str(project.write("mine.py", SOLUTION))],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASSED: 7/7 tests passed" in out.stdout


def test_blame_reruns_stay_inside_the_runs_time_limit(monkeypatch):
    """The reruns that clear an exercise correct on its own share the run's time limit: past the
    deadline none starts, and the exercises stay failing."""
    import time

    from judge import judging

    exercises = [
        judging.ExerciseVerdict("ch42", name, f"fakepkg.mod:{name}", judging.FAILING)
        for name in ("double", "bump")
    ]
    verdict = judging.Verdict(["ch42"], "learner", "", "cpu", exercises, [], [], 0.0)
    started = []
    monkeypatch.setattr(
        judging, "run_pytest", lambda *a: started.append(a[2].time_limit) or judging.RunResult()
    )
    judging._blame(verdict, [], None, judging.RunOptions(), deadline=time.monotonic() - 1)
    assert started == [] and [e.status for e in exercises] == [judging.FAILING] * 2
    judging._blame(verdict, [], None, judging.RunOptions(), deadline=time.monotonic() + 30)
    assert len(started) == 2 and all(t <= 30 for t in started)  # each rerun gets what is left


def test_an_exercise_whose_tests_crash_after_another_corrupted_the_process_is_judged_alone(
    project, capsys, monkeypatch
):
    """As a Triton kernel that stores past a tensor's end does in the interpreter (ch19): the
    memory it corrupts ends the process later, in a test of another exercise. That exercise is
    rerun without the culprit and passes on its own; in a chapter of kernels the crash line says
    where to look."""
    import judge.cli
    import judge.judging

    monkeypatch.setenv("MINISGL_JUDGE_JOBS", "1")  # one process: the crash comes a test later
    # the fake chapter "requires" triton for the crash line's kernel hint, not to run: both places
    # that would refuse it without triton installed let it through
    for module in (judge.cli, judge.judging):
        monkeypatch.setattr(module, "check_requirements", lambda chapters: None)
    registry = project.root / "registry.toml"
    registry.write_text(
        registry.read_text().replace(
            'title = "A fake chapter"', 'title = "A fake chapter"\nrequires = ["triton"]'
        )
    )
    # bump is wrong, and leaves the process poisoned: the third Counter made after it aborts it,
    # which is in test_starting_at (test_is_big makes two), a test only starting_at's
    src = SOLUTION.replace(
        "    self.n += by\n",
        "    self.n += by + 1\n"
        "    import os\n"
        "    made = []\n"
        "    def poisoned(counter):\n"
        "        made.append(1)\n"
        "        if len(made) == 3:\n"
        "            os.abort()\n"
        "        counter.n = 0\n"
        "    type(self).__init__ = poisoned\n",
    )
    assert src != SOLUTION
    code, v = judge_json(capsys, "ch42", "--file", str(project.write("mine.py", src)))
    assert code == 1
    crashed = by_test(v)["test_starting_at"]
    assert crashed["outcome"] == "crashed", crashed
    assert "killed by SIGABRT" in crashed["message"]
    assert "tl.load or tl.store outside its tensor (check the masks)" in crashed["message"]
    exercises = by_exercise(v)
    assert exercises["bump"]["status"] == "failing"
    assert exercises["starting_at"]["status"] == "passing", exercises["starting_at"]
    assert "in a test process that crashed" in exercises["starting_at"]["note"]
