"""Blame where it belongs: a test that goes through the whole engine judges several exercises at
once, so one wrong function fails its neighbours' tests too. `rerun_alone` reruns an exercise
whose failed tests all judge another unfinished exercise with the reference in place of the
others, and reports it passing where they then pass (judging.py calls it on a learner's run)."""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, List

from .protocol import UnitSpec
from .registry import Chapter
from .run_results import RunOptions, TestResult
from .verdicts import ERROR, FAILING, NOT_ATTEMPTED, PASSING, ExerciseVerdict, Verdict


def rerun_alone(
    verdict: Verdict,
    units: List[UnitSpec],
    chapter: Chapter,
    options: RunOptions,
    deadline: float,
    run_pytest: Callable,
) -> None:
    """A test that goes through the whole engine judges several exercises at once, so one wrong
    function fails the tests of its neighbours too. An exercise whose failed tests all judge
    another of the learner's exercises that is not passing (failing, still a stub, or not loaded)
    may be correct: it is rerun on those tests with the reference in place of the others, and if
    they pass it is reported as passing. Nothing else can change the verdict, so nothing else is
    rerun: an exercise with a failed test of its own, or that timed out in its own code, stays
    failing.

    Where some exercises are known to be wrong (those, stubs, code that did not load), the others
    are first rerun together, in one process, with the reference in place of the known ones: if
    all their failed tests pass, that settles them all. Otherwise each is rerun alone, stopping
    at its first failed test, as many at a time as there are cores, forked from the
    run's server when it has one. The reruns share what is left of the run's time limit; an
    exercise not rerun in time stays failing."""
    rerun = [
        ex for ex in verdict.exercises if ex.status == FAILING and _may_be_correct(ex, verdict)
    ]
    if not rerun:
        return
    known = [
        e
        for e in verdict.exercises
        if e.status in (FAILING, NOT_ATTEMPTED, ERROR) and e not in rerun
    ]

    rerun_args = (units, chapter, options, deadline, run_pytest)
    if known and len(rerun) > 1 and _passes(rerun, True, options.jobs, *rerun_args):
        names = ", ".join(e.name for e in known)
        for ex in rerun:
            _cleared(ex, names)
        return

    workers = max(1, min(len(rerun), os.cpu_count() or 1))

    def alone(ex: ExerciseVerdict) -> None:  # the run's processes shared among the reruns
        if _passes([ex], True, max(1, options.jobs // workers), *rerun_args):
            _cleared(ex, "your other exercises")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(alone, rerun))


def _may_be_correct(ex: ExerciseVerdict, verdict: Verdict) -> bool:
    """Whether every failed test of `ex` may have failed because of another exercise."""
    suspects = [
        e for e in verdict.exercises if e is not ex and e.status in (FAILING, NOT_ATTEMPTED, ERROR)
    ]
    for t in ex.tests:
        if t.ok or _not_run(t):
            continue  # a test not run after a timeout says nothing: the timeout decides
        if t.process_died and suspects:
            continue  # another exercise's code may have corrupted the process that crashed
        if t.outcome == "timeout" and t.culprit == ex.id:
            return False  # its own code was running when the test ran out of time
        if not any(t.test == u.test for e in suspects for u in e.tests):
            return False
    return True


def _not_run(t: TestResult) -> bool:
    """Not run because an exercise it judges had already timed out (timer.py)."""
    return (
        t.outcome == "error"
        and (t.message or "").startswith("not run: ")
        and "already timed out" in t.message
    )


def _selector(nodeid: str, chapter: Chapter) -> str:
    """A test's node id as a path pytest finds from anywhere: the chapter's test file, absolute."""
    file, _, rest = nodeid.partition("::")
    path = next((f for f in chapter.test_files if f.name == Path(file).name), Path(file))
    return f"{path}::{rest}"


def _passes(
    exercises: List[ExerciseVerdict],
    stop: bool,
    jobs: int,
    units: List[UnitSpec],
    chapter: Chapter,
    options: RunOptions,
    deadline: float,
    run_pytest: Callable,
) -> bool:
    """Whether the exercises' failed tests all pass when rerun with the reference around them."""
    left = deadline - time.monotonic()
    if left < 1:
        return False
    failed = sorted({_selector(t.test, chapter) for ex in exercises for t in ex.tests if not t.ok})
    run = run_pytest(
        [u.only([ex.id for ex in exercises]) for u in units],
        failed,
        dataclasses.replace(options, time_limit=left, stop_at_first_failure=stop, jobs=jobs),
    )
    return bool(run.tests) and not run.general and all(t.ok for t in run.tests)


def _cleared(ex: ExerciseVerdict, instead: str) -> None:
    ex.status = PASSING
    failed, total = sum(not t.ok for t in ex.tests), len(ex.tests)
    crashed = any(t.process_died for t in ex.tests if not t.ok)
    # Two measurements, each named: this run (all the learner's exercises in) and the rerun
    # (the reference in place of the others); the row's count is the rerun's.
    why = (
        "in a test process that crashed (code that corrupts the process, such as a store "
        "past a tensor's end, can crash or fail the tests that run after it)"
        if crashed
        else f"as they also go through {instead}"
    )
    ex.note = (
        f"correct on its own: {failed} of its {total} tests failed in this run, {why}; "
        f"rerun with the reference in place of {instead}, they pass, so all {total} pass "
        "on its own"
    )
