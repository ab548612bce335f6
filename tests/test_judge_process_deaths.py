"""Learner code that ends a process of the judge's chain (its own test process, the fork server
that is its parent, the files it writes to) is never judged passing, and the verdict says what
happened.

A verdict is built from evidence: every collected test reported with its outcome, by a test
process whose end the judge saw (its exit status came back from the fork server). These run on
the fake chapter (judge_fixtures.py), about a second a run; each hostile `double` then computes the
right answer, so a pass would mean the attack went unnoticed.

The kill is done once per run (a marker file), and only when the parent is the judge's fork
server: a restarted test process's parent is this pytest process, which must survive the test."""

from __future__ import annotations

import json
import sys

import pytest

from judge.cli import main
from judge.event_replay import replay
from judge.protocol import Collected, Finished, Result, Start, Swapped
from judge.run_results import RunOptions, RunResult
from judge.runner import _merge
from judge_fixtures import SOLUTION, fake_project

RIGHT = "    return x * SCALE\n"
KILLS_THE_FORK_SERVER = (
    """
import os, signal

def double(x):
    marker = {marker!r}
    parent = os.getppid()
    with open(f"/proc/{{parent}}/cmdline", "rb") as f:
        is_server = b"judge.forkserver" in f.read()
    if is_server and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(parent, signal.SIGKILL)
"""
    + RIGHT
)
EXITS_0_IN_A_TEST = "import os\n\ndef double(x):\n    os._exit(0)\n" + RIGHT
# every file it has open: pytest's output, the capture's files, the judge's results file
CLOSES_ITS_FILES = "import os\n\ndef double(x):\n    os.closerange(1, 4096)\n" + RIGHT
# a default value is computed when the learner's code is loaded, before any test
SYS_EXIT_0_WHILE_LOADING = "import sys\n\ndef double(x, _=sys.exit(0)):\n" + RIGHT
OS_EXIT_0_WHILE_LOADING = "import os\n\ndef double(x, _=os._exit(0)):\n" + RIGHT


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the killer reads /proc")


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    return fake_project(tmp_path, monkeypatch)


def judged(project, capsys, double: str) -> tuple:
    others = SOLUTION.split("def bump", 1)[1]
    path = project.write("mine.py", double + "\n\ndef bump" + others)
    code = main(["ch42", "--file", str(path), "--json"])
    v = json.loads(capsys.readouterr().out)
    return code, v, {e["name"]: e for e in v["exercises"]}, {t["test"]: t for t in v["tests"]}


@LINUX
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_killing_the_judges_fork_server_never_passes(project, capsys, monkeypatch, tmp_path, jobs):
    """The kill lands on the fork server, the test process's parent: the test that did it goes on
    and reports passing, and before the fix a share that finished before the judge noticed the
    server gone was trusted (1 run in 2 of the grader's class)."""
    monkeypatch.setenv("MINISGL_JUDGE_JOBS", jobs)
    marker = tmp_path / "killed"
    for attempt in range(4):  # the race is lost some runs in every order: each must be right
        marker.unlink(missing_ok=True)
        code, v, ex, tests = judged(
            project, capsys, KILLS_THE_FORK_SERVER.format(marker=str(marker))
        )
        assert marker.exists(), "the fork server was not the test process's parent"
        assert code == 1 and not v["passed"], (attempt, ex["double"], v["general"])
        assert ex["double"]["status"] != "passing", (attempt, ex["double"], tests)
        said = " ".join(t["message"] or "" for t in tests.values()) + " ".join(v["general"])
        assert "fork server" in said and "was killed" in said, (attempt, said)


@LINUX
def test_no_blame_rerun_after_the_fork_server_was_killed(project, capsys, monkeypatch, tmp_path):
    """`is_big` kills the fork server and computes right; its one test is shared with a wrong
    `starting_at`, so the blame reruns would judge it alone, in a process started afresh whose
    parent is the judge, where the kill does nothing (done once here; in the grader's sandbox,
    before the judge stopped being the namespace's init, dropped by the kernel): "passing on its
    own". After a killed fork server no exercise is rerun."""
    monkeypatch.setenv("MINISGL_JUDGE_JOBS", "1")
    killer = KILLS_THE_FORK_SERVER.format(marker=str(tmp_path / "killed"))
    killer = killer.replace("def double(x):", "def is_big(self):").replace(RIGHT, "")
    wrong_starting_at = "def starting_at(cls, n):\n    c = cls()\n    c.n = n + 1\n    return c\n"
    source = SOLUTION.split("def is_big", 1)[0] + killer + "    return self.n > 10\n\n"
    path = project.write("mine.py", source + wrong_starting_at)
    code = main(["ch42", "--file", str(path), "--json"])
    ex = {e["name"]: e for e in json.loads(capsys.readouterr().out)["exercises"]}
    assert (tmp_path / "killed").exists()
    assert code == 1 and ex["starting_at"]["status"] == "failing"
    assert ex["is_big"]["status"] == "failing", ex["is_big"]


def test_os_exit_0_in_the_middle_of_a_test_never_passes(project, capsys):
    code, v, ex, tests = judged(project, capsys, EXITS_0_IN_A_TEST)
    assert code == 1 and ex["double"]["status"] == "failing"
    crashed = [t for t in tests.values() if t["outcome"] == "crashed"]
    assert crashed and all("exit status 0" in t["message"] for t in crashed), crashed
    assert ex["bump"]["status"] == "passing"  # the other exercises are still judged


def test_closing_the_test_process_files_never_passes(project, capsys):
    code, v, ex, tests = judged(project, capsys, CLOSES_ITS_FILES)
    assert code == 1 and not v["passed"]
    assert ex["double"]["status"] == "failing", (ex["double"], tests, v["general"])
    crashed = [t for t in tests.values() if t["outcome"] == "crashed"]
    assert crashed and all("ended abruptly (exit status" in t["message"] for t in crashed), tests


def test_sys_exit_0_while_loading_never_passes(project, capsys):
    code, v, ex, tests = judged(project, capsys, SYS_EXIT_0_WHILE_LOADING)
    assert code == 1 and not v["passed"]
    assert "passing" not in {e["status"] for e in ex.values()}, ex  # a file is loaded as one
    assert "raised SystemExit(0)" in ex["double"]["problem"], ex["double"]


def test_os_exit_0_while_loading_never_passes(project, capsys):
    code, v, ex, tests = judged(project, capsys, OS_EXIT_0_WHILE_LOADING)
    assert code == 1 and not v["passed"] and not tests
    assert {e["status"] for e in ex.values()} == {"error"}, ex
    assert "ended abruptly (exit status 0" in v["general"][0] and "while loading" in v["general"][0]


# The evidence rule itself, on events as a test process writes them (protocol.py).

TESTS = ["t.py::test_a", "t.py::test_b"]


def _events(*, finished: bool, started_last: bool = False) -> list:
    events = [Swapped({}, []), Collected(TESTS)]
    for t in TESTS[: 1 if started_last else 2]:
        events += [Start(t), Result(t, "passed")]
    if started_last:
        events.append(Start(TESTS[1]))
    return events + ([Finished()] if finished else [])


@pytest.mark.parametrize(
    "returncode, void",
    [
        (None, True),  # its parent, the fork server, killed: no exit status came back
        (0, False),
        (1, False),
        (-11, False),  # a crash in the interpreter's teardown, after the last test: not a result
    ],
)
def test_reported_passes_count_only_from_a_process_whose_end_the_judge_saw(returncode, void):
    result = RunResult()
    over = replay(_events(finished=True), returncode, False, RunOptions(), [], result)
    assert over
    if not void:
        assert [t.outcome for t in result.tests] == ["passed", "passed"] and not result.general
    else:  # every pass of that process is void, and says why
        assert [t.outcome for t in result.tests] == ["crashed", "crashed"], result.tests
        assert all("fork server" in t.message for t in result.tests), result.tests


def test_a_test_running_when_the_fork_server_died_is_blamed_and_not_excused():
    """The test that killed the fork server may have reported passing before the kernel ended its
    process (in a later test): every result of that process is void, none excused, no restart."""
    result = RunResult()
    events = _events(finished=False, started_last=True)
    over = replay(events, None, False, RunOptions(), [], result)
    assert over  # a fresh process's parent would be the judge: the next target
    assert [(t.test, t.outcome) for t in result.tests] == [(t, "crashed") for t in TESTS]
    assert all("fork server" in t.message and "was killed" in t.message for t in result.tests)
    # a crash that corrupted memory may be another exercise's doing (rerun_alone excuses it);
    # a supervisor killed while this test ran is not a corruption: nothing excuses it
    assert not any(t.process_died for t in result.tests)


def test_a_share_that_died_before_reporting_its_tests_leaves_them_failed():
    """Two shares: the second died before its collection reached the judge, so only the first
    share's tests have results. Its tests are the whole collection's minus the first's."""
    order = TESTS + ["t.py::test_c"]
    first = RunResult(order=order, collected=[TESTS[0]])
    first.tests.append(_result(TESTS[0]))
    second = RunResult(general=["the test process ended abruptly (exit status 0)"])
    merged = _merge([first, second])
    assert [t.test for t in merged.tests] == order
    assert [t.outcome for t in merged.tests] == ["passed", "error", "error"]
    assert "ended abruptly (exit status 0)" in merged.tests[1].message


def _result(test):
    from judge.run_results import TestResult

    return TestResult(test, "passed")
