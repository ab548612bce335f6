"""Bugs found in a review of the judge (budgets, blame reruns, the fork server, messages), each
pinned by a test that fails without its fix. They reuse the fake chapter ch44 of
test_judge_speed.py (a tiny engine whose `run` calls `step`), where a judged run takes a second."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from judge_fixtures import fake_project  # noqa: F401  (the project fixture needs it importable)
from test_judge_speed import RUN, STEP, TWICE, by_exercise, by_test, judge_file, project  # noqa: F401

# `step` is right but slow (10 ms of CPU a call: the budgets count CPU time, so a sleeping step
# would reach only the wall-clock cap, some 30 s later); `run` calls it forever: the stack at the
# timeout holds both.
SLOW_STEP = (
    "def step(self, x):\n    import time\n    end = time.process_time() + 0.01\n"
    "    while time.process_time() < end:\n        pass\n    return x + 1\n"
)
ENDLESS_RUN = "def run(self, n):\n    x = 0\n    while True:\n        x = self.step(x)\n"


def test_a_callee_is_not_blamed_for_the_endless_loop_of_its_caller(project, capsys):
    # At the timeout `step` is innermost on the stack nearly every time: blaming it would fail a
    # correct exercise (and stop its own tests). Only a rerun alone can tell which one loops.
    code, v = judge_file(project, capsys, SLOW_STEP + "\n\n" + ENDLESS_RUN + "\n\n" + TWICE)
    ex = by_exercise(v)
    assert ex["step"]["status"] == "passing", (
        f"step is right and only run loops forever calling it, yet step is {ex['step']['status']}"
    )
    assert ex["run"]["status"] == "failing", f"run loops forever, yet it is {ex['run']['status']}"
    assert ex["twice"]["status"] == "passing", f"twice is right, yet it is {ex['twice']['status']}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def test_ctrl_c_leaves_no_forked_test_process_running(tmp_path):
    """Ctrl-C reaches the judge and its fork server (one foreground group), not the forked test
    process (a session of its own): it must not go on running the tests after the judge is gone."""
    from judge import forkserver
    from judge.registry import REPO

    if not forkserver.available():
        pytest.skip("no fork on this platform")
    pidfile = tmp_path / "pid"
    (tmp_path / "test_sleep.py").write_text(
        "import os, pathlib, time\n\ndef test_sleep():\n    "
        f"pathlib.Path({str(pidfile)!r}).write_text(str(os.getpid()))\n"
        "    time.sleep(60)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    # As in a terminal: Ctrl-C raises KeyboardInterrupt here, and the server starts with the default
    # too.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    server = forkserver.ForkServer(str(REPO), ["pytest"])
    main = threading.get_ident()

    def ctrl_c():
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        os.kill(server.proc.pid, signal.SIGINT)
        signal.pthread_kill(main, signal.SIGINT)

    try:
        assert server.ready, "the fork server did not start"
        threading.Thread(target=ctrl_c, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            server.run(
                ["-q", "-p", "no:cacheprovider", str(tmp_path / "test_sleep.py")],
                env,
                str(tmp_path),
                str(tmp_path / "out.txt"),
                120,
                None,
            )
    finally:
        server.close()  # as judge() does on its way out
        signal.signal(signal.SIGINT, old)
    pid = int(pidfile.read_text())
    for _ in range(100):
        if not _alive(pid):
            break
        time.sleep(0.05)
    still = _alive(pid)
    if still:
        os.kill(pid, signal.SIGKILL)
    assert not still, "after Ctrl-C the forked test process was still running its tests"


def test_an_assert_in_the_learners_code_is_not_said_to_be_the_tests(project, capsys):
    # pytest rewrites only the tests' asserts; one in the learner's (or the engine's) code reaches
    # the judge with no message at all, and the test never said anything about it.
    code, v = judge_file(
        project, capsys, "def step(self, x):\n    assert x < 0\n    return x + 1\n"
    )
    message = by_test(v)["test_step"]["message"] or ""
    assert "the test gave no message" not in message and "assert x < 0" in message, (
        f"the failed assert of the learner's step is not named: {message!r}"
    )


def test_tests_not_run_after_a_timeout_are_not_said_to_have_run(project, capsys):
    from judge.cli import main

    mine = project.write("mine.py", "def step(self, x):\n    while True:\n        x += 1\n")
    main(["ch44", "--file", str(mine)])
    out = capsys.readouterr().out
    summary = next((line for line in out.splitlines() if "tests passed" in line), "")
    # one timeout, then step's four other tests not run: the screen must not call them run, nor
    # errors
    assert "4 not run" in summary and "error" not in summary and "that ran" not in out, (
        f"the report counts the 4 tests not run after the timeout as run or as errors: {summary!r}"
    )


def test_a_mutant_that_breaks_a_test_modules_import_is_killed(project, capsys, monkeypatch):
    # A test module that calls the exercise at import: a mutant returning a float fails collection.
    # The reference collected fine, so that is the mutant caught, not a broken setup (exit 3).
    from tools.mutants.__main__ import main

    monkeypatch.setenv("MINISGL_MUTANTS_RESULTS", str(project.root / "results"))
    tests = project.root / "fake_tests" / "test_fake.py"
    tests.write_text(
        tests.read_text().replace(
            "from fakepkg.user import quadruple\n",
            "from fakepkg.user import quadruple\n\nSIX = list(range(double(3)))\n",
        )
    )
    code = main(["ch42", "--exercise", "double", "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "100.0 % killed" in out, (
        f"a mutant that breaks the tests' import was not counted as killed (exit {code}): "
        f"{out[-300:]}"
    )


def test_without_signals_a_hang_is_a_timeout_not_a_crash(project, capsys, monkeypatch):
    # Where a test cannot be interrupted (Windows), pytest-timeout's thread method ends the whole
    # process on a hang: the learner must read "did not finish", not "a crash".
    from judge import pytest_process

    monkeypatch.setattr(pytest_process, "_timer_usable", lambda: False)
    monkeypatch.setattr(pytest_process, "_timeout_method", lambda: "thread")
    code, v = judge_file(
        project,
        capsys,
        "def step(self, x):\n    while True:\n        x += 1\n",
        "-k",
        "test_step",
        "--timeout",
        "1",
    )
    hung = by_test(v)["test_step"]
    assert hung["outcome"] == "timeout" and "did not finish in 1 s" in (hung["message"] or ""), (
        f"a hang stopped by pytest-timeout is reported as {hung['outcome']}: {hung['message']}"
    )
