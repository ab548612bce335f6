"""Reading one pytest process's events (protocol.py) into the run's result: `replay` folds them
in and, after a process that did not finish, reports the test it was in (a crash, a hang,
pytest-timeout ending the process) or why the run stopped.

Events are evidence only from a process that wrote `Finished` with no test left open, and whose
end the judge saw (its exit status came back; whatever it is, after the last test it changes no
result: a crash in the interpreter's teardown is not the learner's). The learner's code runs in that
process and can kill the fork server that is its parent and reports its end, then finish its test as
if nothing had happened: every pass of a process whose end went unreported is void, saying why."""

from __future__ import annotations

import dataclasses
import re
from typing import List, Tuple

from .child_process import exit_reason
from .protocol import (
    Collected,
    CollectError,
    CpuTime,
    Event,
    Fatal,
    Finished,
    OverBudget,
    Result,
    Start,
    Swapped,
)
from .run_results import RunOptions, RunResult, TestResult

# What pytest-timeout's thread method prints before it ends the process with os._exit(1).
_PYTEST_TIMEOUT_EXIT = re.compile(r"\+{3,} Timeout \+{3,}\s*$")


def replay(
    events: List[Event],
    returncode: int | None,
    killed: bool,
    options: RunOptions,
    done: List[str],
    result: RunResult,
) -> bool:
    """Fold one process's events into `result`; after a process that did not finish, report the test
    it was in. Returns True when no further attempt is needed."""
    first = len(result.tests)
    started, finished = _fold(events, done, result)
    # no exit status, and not killed on time: its parent, the fork server, was killed
    lost = returncode is None and not killed
    if lost:
        # only the tests and the learner's code run in that process: a test that reported
        # passing may be the one that killed it, going on as if nothing had happened
        _void(result.tests[first:])
    if finished and started is None:
        return True
    return _unfinished(events, started, first, returncode, killed, options, done, result)


def _void(tests: List[TestResult]) -> None:
    """The passes a process reported before its fork server was killed are no evidence."""
    why = (
        f"reported passing, but the test process's end went unreported ({exit_reason(None)}), "
        "so the result cannot be trusted"
    )
    for t in tests:
        if t.ok:  # a failure stays one
            t.outcome, t.message = "crashed", why


def _fold(events: List[Event], done: List[str], result: RunResult) -> Tuple[str | None, bool]:
    """Fold the events into `result`: (the test started and not reported, the process finished
    or must not be restarted)."""
    started: str | None = None
    finished = False
    for ev in events:
        if isinstance(ev, Swapped):
            result.problems.update(ev.problems)
            for g in ev.general:
                if g not in result.general:
                    result.general.append(g)
        elif isinstance(ev, Collected):
            result.collected += [t for t in ev.tests if t not in result.collected]
            result.order = result.order or ev.order
        elif isinstance(ev, CollectError):
            msg = f"the tests could not be collected ({ev.where}): {ev.message}"
            if msg not in result.general:
                result.general.append(msg)
        elif isinstance(ev, Start):
            started = ev.test
        elif isinstance(ev, Result):
            started = None
            fields = {f.name: getattr(ev, f.name) for f in dataclasses.fields(ev)}
            result.tests.append(TestResult(**fields))
            done.append(ev.test)
        elif isinstance(ev, CpuTime):
            for t in reversed(result.tests):
                if t.test == ev.test:
                    t.cpu = ev.seconds
                    break
        elif isinstance(ev, OverBudget):
            result.over_budget[ev.test] = ev.budget
        elif isinstance(ev, Finished):
            finished = True
        elif isinstance(ev, Fatal):
            result.general.append(ev.message)
            return started, True
    return started, finished


def _unfinished(
    events: List[Event],
    started: str | None,
    first: int,
    returncode: int | None,
    killed: bool,
    options: RunOptions,
    done: List[str],
    result: RunResult,
) -> bool:
    """A process that did not finish: report the test it was in, else why the run stopped."""
    # A crash may be another exercise's doing (memory it corrupted earlier): rerun_alone judges
    # the exercises of the tests this process ran again without it. A killed fork server is no
    # corruption: the code running when it died is the likeliest killer, and nothing excuses it.
    lost = returncode is None and not killed
    if not killed and not lost:
        for t in result.tests[first:]:
            t.process_died = True
    if killed:
        why = f"the run exceeded its time limit of {options.time_limit:.0f} s and was stopped"
    else:
        why = f"the test process ended abruptly ({exit_reason(returncode)})"
    if started is not None:
        if not killed and _PYTEST_TIMEOUT_EXIT.search(result.output_tail[-4000:]):
            # pytest-timeout's thread method (no signals: Windows) ends the process on a hang
            outcome, message = (
                "timeout",
                (
                    f"the test did not finish in {options.test_timeout:g} s "
                    "(an endless loop, or far too slow)"
                ),
            )
        else:
            outcome, message = ("timeout" if killed else "crashed"), why + " during this test"
        result.tests.append(
            TestResult(
                started, outcome, message=message, process_died=outcome == "crashed" and not lost
            )
        )
        done.append(started)
        # after a kill on time, the time is up; after a crash, go on with the rest; after the
        # fork server was killed, stop: a fresh process's parent would be the judge itself (the
        # learner's kernel, for judge.check), the next target of the code that killed it
        return killed or lost
    if not any(isinstance(ev, Swapped) for ev in events):
        why += " while loading your code"
    result.general.append(why + _output_hint(result.output_tail, events))
    return True


def _output_hint(tail: str, events) -> str:
    if events or not tail.strip():
        return ""
    last = "\n".join(tail.strip().splitlines()[-8:])
    return f"\n  last output:\n{last}"
