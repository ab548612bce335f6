"""Time budgets inside the test process (`pytest -p judge.timer`, next to judge.plugin; POSIX).

Each test gets a budget (budgets.py: from the reference's measured time) and a hard cap
(`--timeout`). A sampler thread looks at the main thread's stack every SAMPLE seconds and counts
the process's CPU time while the engine (the exercises' package, e.g. minisgl) or the learner's
code is running (CPU time, as the budgets were measured: a busy machine stretches wall time, not
CPU time); the tests' own work (Hugging Face references, building prompts) does not count. Code
that spends no CPU (blocked in a recv or a sleep) is caught by its wall time instead: the seconds
the learner's code sits on the stack with the process idle count against the budget's `wait`. When
a count passes its budget, or the test's wall time passes the hard cap, the main thread gets a
SIGALRM whose handler raises `BudgetTimeout` where it was spinning, so the report names the
learner's line.

Once a test has timed out in an exercise's code, that exercise's other tests are not run: each is
reported as "not run: <exercise> already timed out in <test>". A timeout with no learner code on the
stack, or with the code of several exercises on it (one calling the other), is put on every swapped
exercise the test judges.

Code that runs in other processes (the ranks of a group, forked or spawned) is out of the sampler's
sight; the test's harness waits for it with a timeout of its own and raises when it passes. An
exception that sets `hung = True` says that: the test counts as a timeout, put on the one
swapped exercise the test judges (else on every one), and that exercise's other tests are not run.

In a reference run (nothing swapped) nothing is stopped at its budget; a test whose engine time
passes it is reported as an `over_budget` event: the budgets file is stale.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from . import failure_messages, plugin
from .budgets import test_key
from .protocol import CpuTime, ExerciseSpec, OverBudget, RunSpec
from .registry import test_matches

SAMPLE = 0.05  # seconds between two looks at the stack
# Wall time counts as waiting (against the budget's `wait`, budgets.py) while the learner's code is
# on the stack and the process uses under this share of a core: blocked, not merely slowed by a
# busy machine, which still gives a runnable process its share.
IDLE_SHARE = 0.1
# After a timeout that learner code swallowed (`except BaseException`), raise again this often.
RETRY = 1.0


class BudgetTimeout(BaseException):
    """A test ran out of its time budget. A BaseException, so that `except Exception` in learner
    code does not swallow it."""


class NotRun(Exception):
    """A test not run because an exercise it judges already timed out."""


class _Timer:
    def __init__(self, spec: RunSpec) -> None:
        assert spec.budget is not None
        self.budget = spec.budget
        self.labels = {s.label: s.exercise for s in spec.snippets}
        swapped = spec.swapped
        self.exercises: Dict[str, ExerciseSpec] = {e.id: e for e in swapped}
        self.attrs = {e.attr: e.id for e in swapped}
        self.names = {e.name: e.id for e in swapped}
        self.reference_run = not swapped
        self.dirs = tuple(_package_dirs(self.budget.packages))
        self.not_counted = tuple(_package_dirs(self.budget.not_counted))
        self.timed_out: Dict[str, str] = dict(spec.timed_out)  # exercise id -> test
        self.shared = spec.shared_timeouts  # a sharded run's common record of them (runner.py)
        self.main = threading.get_ident()
        self.item: pytest.Item | None = None
        self.pending: Dict[str, Any] | None = None  # why the next SIGALRM raises
        self.raised = False  # the handler has raised BudgetTimeout in this test
        self.over: float | None = None  # a reference run: the budget this test's engine time passed
        self.first = True  # no test has run in this process yet: the next pays for its start

    # -- the stack

    def counts(self, frame) -> bool:
        """Whether the engine or the learner's code is running in this stack: the innermost frame
        that is theirs, or a library's whose time is not theirs (Triton compiling a kernel, Hugging
        Face), decides."""
        while frame is not None:
            name = frame.f_code.co_filename
            if name in self.labels:
                return True
            # before the engine's own dirs: a module of the engine may be one that only waits
            if self.not_counted and name.startswith(self.not_counted):
                return False
            if name.startswith(self.dirs):
                return True
            frame = frame.f_back
        return False

    def learner_running(self, frame) -> bool:
        while frame is not None:
            if frame.f_code.co_filename in self.labels:
                return True
            frame = frame.f_back
        return False

    def culprit(self, frame) -> str | None:
        """The swapped exercise whose code was running: the one exercise with code on the stack (an
        exercise function, or a helper in its notebook cell). None when there is none, or when
        several are: one stack cannot tell whether the callee spins or the caller calls it
        endlessly, so the timeout counts for all of them and the blame reruns decide."""
        found = set()
        while frame is not None:
            code = frame.f_code
            if code.co_filename in self.labels:
                owner = self.attrs.get(code.co_name) or self.names.get(
                    self.labels[code.co_filename] or ""
                )
                if owner is not None:
                    found.add(owner)
            frame = frame.f_back
        return found.pop() if len(found) == 1 else None

    # -- one test

    def run(self, item: pytest.Item):
        # the process's first test that runs (one not run starts no engine) pays for its start
        first = self.first and self.blocked_by(item) is None
        self.first = self.first and not first
        limit = self.budget.limit(test_key(item.nodeid), first=first)
        self.item, self.pending, self.over, self.raised = item, None, None, False
        done = threading.Event()
        thread = threading.Thread(
            target=self._watch, args=(item, limit, self.budget.hard, done), daemon=True
        )
        cpu = time.process_time()
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.item = None
            # Written here, by the main thread (the results file is its): the test's CPU time, which
            # budgets.py measures the reference by (a busy machine stretches wall time, not CPU
            # time).
            plugin._judge.write(CpuTime(item.nodeid, round(time.process_time() - cpu, 3)))
            if self.over is not None:
                plugin._judge.write(OverBudget(item.nodeid, round(self.over, 2)))

    def _watch(self, item: pytest.Item, limit: float, hard: float, done: threading.Event) -> None:
        start = time.monotonic()
        # CPU time, not wall time, as the budgets were measured: on a busy machine (two cores
        # shared by many) the wall time of correct code stretches several times over, its CPU
        # time hardly at all. Code that spins burns CPU and is stopped at its budget; code that
        # only waits is stopped at the hard cap.
        last, last_wall = time.process_time(), start
        used = waited = 0.0
        wait_limit = max(self.budget.wait, limit)
        raised_at = None
        while not done.wait(SAMPLE):
            now, cpu = time.monotonic(), time.process_time()
            frame = sys._current_frames().get(self.main)
            if frame is not None and self.counts(frame):
                used += cpu - last
            if cpu - last < IDLE_SHARE * (now - last_wall) and frame is not None:
                if self.learner_running(frame):
                    waited += now - last_wall
            last, last_wall = cpu, now
            blocked = waited > wait_limit and not self.reference_run
            over = used > limit
            if self.reference_run and over and self.over is None:
                self.over = limit  # the reference itself spent more than the budget: stale
            if raised_at is not None:
                # Not raised yet (pytest was between phases), or swallowed by learner code that
                # goes on spinning (`except BaseException`): again.
                again = not self.raised or (frame is not None and self.learner_running(frame))
                if again and now - raised_at >= RETRY:
                    raised_at = now
                    self._interrupt()
            elif (over and not self.reference_run) or blocked or now - start > hard:
                culprit = self.culprit(frame) if frame is not None else None
                self.pending = {
                    "limit": limit,
                    "hard": not over and not blocked,
                    "waited": wait_limit if blocked and not over else None,
                    "culprit": culprit,
                }
                raised_at = now
                self._interrupt()
            del frame  # keep no frame (and its locals) alive between looks

    def _interrupt(self) -> None:
        try:
            signal.pthread_kill(self.main, signal.SIGALRM)
        except (OSError, ValueError):
            pass

    def on_alarm(self, signum, frame) -> None:
        if self.item is None or self.pending is None or not _inside_a_test_phase(frame):
            return  # between phases pytest would not catch it: the watcher tries again shortly
        p = self.pending
        self.raised = True
        if p["hard"]:
            raise BudgetTimeout(
                f"the test did not finish in {self.budget.hard:g} s (an endless loop, "
                "or far too slow)"
            )
        if p["waited"] is not None:
            raise BudgetTimeout(
                f"the test waited over {p['waited']:.3g} s in your code without computing (a "
                "call that blocks and never returns: a recv, a get or a wait with no timeout, a "
                "sleep)"
            )
        measured = self.budget.measured.get(test_key(self.item.nodeid))
        base = f"; the reference takes {measured:.2g} s" if measured is not None else ""
        raise BudgetTimeout(
            f"the test did not finish within its time budget of {p['limit']:.3g} s{base} "
            "(an endless loop, or far too slow)"
        )

    # -- after a timeout

    def record(self, item: pytest.Item, culprit: str | None) -> None:
        """Which exercises timed out in `item`: the one whose code was running, else every swapped
        exercise the test judges."""
        ids = (
            [culprit]
            if culprit
            else [i for i, e in self.exercises.items() if _judges(e, item.nodeid)]
        )
        for i in ids:
            self.timed_out.setdefault(i, item.nodeid)
        if self.shared:
            with open(self.shared, "a", encoding="utf-8") as f:  # one short append: atomic
                f.write("".join(f"{i}\t{item.nodeid}\n" for i in ids))

    def sole_judge(self, item: pytest.Item) -> str | None:
        """The one swapped exercise that `item` judges, if only one does."""
        ids = [i for i, e in self.exercises.items() if _judges(e, item.nodeid)]
        return ids[0] if len(ids) == 1 else None

    def blocked_by(self, item: pytest.Item) -> str | None:
        if self.shared:  # what the run's other shares have recorded
            try:
                with open(self.shared, encoding="utf-8") as f:
                    for line in f:
                        ex_id, _, test = line.rstrip("\n").partition("\t")
                        if test:
                            self.timed_out.setdefault(ex_id, test)
            except OSError:
                pass
        for ex_id, test in self.timed_out.items():
            ex = self.exercises.get(ex_id)
            if ex is not None and _judges(ex, item.nodeid):
                return f"not run: {ex.name} already timed out in {test.split('::', 1)[-1]}"
        return None


def _stopped_elsewhere(exc: BaseException) -> BaseException | None:
    """The exception in `exc`'s chain by which a test's harness says it stopped the code under test
    after its own timeout, in a process the sampler does not see: one that sets `hung = True`
    (classroom/ranks.py's RanksTimedOut, the engine's RankFailure after a collective timed out)."""
    for e in failure_messages.chain(exc):
        if getattr(e, "hung", False) is True:
            return e
    return None


def _judges(exercise: ExerciseSpec, nodeid: str) -> bool:
    return any(test_matches(ref, nodeid) for ref in exercise.tests)


def _inside_a_test_phase(frame) -> bool:
    """Whether pytest is running a phase's function here (CallInfo.from_call catches what it
    raises)."""
    below = False
    while frame is not None:
        if frame.f_code is _FROM_CALL and below:
            return not _FROM_CALL_LINES or frame.f_lineno in _FROM_CALL_LINES
        below = True
        frame = frame.f_back
    return False


def _call_lines():
    import inspect

    from _pytest.runner import CallInfo

    code = CallInfo.from_call.__func__.__code__
    lines, first = inspect.getsourcelines(code)
    return code, {first + i for i, ln in enumerate(lines) if "func()" in ln}


_FROM_CALL, _FROM_CALL_LINES = _call_lines()


def _package_dirs(packages: List[str]) -> List[str]:
    dirs = []
    for name in packages:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for d in (found.submodule_search_locations or []) if found else []:
            dirs.append(str(Path(d).resolve()) + os.sep)
            dirs.append(str(Path(d)) + os.sep)
        if found and not found.submodule_search_locations and found.origin:  # a module: its file
            dirs += [str(Path(found.origin).resolve()), str(found.origin)]
    return dirs


_timer: _Timer | None = None


@pytest.hookimpl(trylast=True)  # after judge.plugin has read the spec
def pytest_configure(config: pytest.Config) -> None:
    global _timer
    judge = plugin._judge
    if judge is None or judge.spec.budget is None or not hasattr(signal, "pthread_kill"):
        return
    _timer = _Timer(judge.spec)
    signal.signal(signal.SIGALRM, _timer.on_alarm)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if _timer is None:
        yield
        return
    yield from _timer.run(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _timer is not None:
        why = _timer.blocked_by(item)
        if why:
            raise NotRun(why)


def describe(excinfo: pytest.ExceptionInfo, item: pytest.Item) -> Dict[str, Any] | None:
    """The result fields for a budget timeout or a test not run (None for anything else)."""
    exc = excinfo.value
    if isinstance(exc, NotRun):
        return {
            "message": str(exc),
            "sentinel": None,
            "standin": False,
            "where": None,
            "timeout": False,
        }
    stopped = _stopped_elsewhere(exc)
    if stopped is not None:
        # the test's own harness stopped code that ran in another process (a rank of a group):
        # the sampler could not see it, but it hung all the same
        info = failure_messages.describe(excinfo, plugin._judge)
        culprit = _timer.sole_judge(item) if _timer is not None else None
        if _timer is not None:
            _timer.record(item, culprit)
        return {**info, "timeout": True, "culprit": culprit}
    if isinstance(exc, BudgetTimeout):
        culprit = _timer.pending.get("culprit") if _timer is not None and _timer.pending else None
        if _timer is not None:
            _timer.record(item, culprit)
        return {
            "message": str(exc),
            "sentinel": None,
            "standin": False,
            "where": failure_messages.learner_frame(failure_messages.chain(exc), plugin._judge),
            "timeout": True,
            "culprit": culprit,
        }
    return None
