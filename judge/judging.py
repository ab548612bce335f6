"""From learner code to a verdict: build the subprocess's swap spec, run the chapter's tests, and
sort the outcomes per exercise."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence

from .protocol import ExerciseSpec, SnippetSpec, UnitSpec
from .registry import Chapter, Exercise, check_requirements
from .runner import RunOptions, RunResult, TestResult, run_pytest
from .sources import LearnerCode

# An exercise's status, in the order a learner cares about them.
PASSING, FAILING, NOT_ATTEMPTED, ERROR, NO_TESTS, REFERENCE = (
    "passing",
    "failing",
    "not attempted",
    "error",
    "no tests",
    "reference",
)


@dataclass
class ExerciseVerdict:
    chapter: str
    name: str
    target: str
    status: str
    problem: str | None = None
    attempted: bool = True
    tests: List[TestResult] = field(default_factory=list)
    note: str | None = None  # e.g. why a passing exercise still has failed tests listed

    @property
    def id(self) -> str:
        return f"{self.chapter}.{self.name}"

    @property
    def attr(self) -> str:
        """The function's name in the learner's code: `Scheduler._free_req_resources` ->
        `_free_req_resources`."""
        return self.target.rpartition(":")[2].rpartition(".")[2]

    @property
    def passed_count(self) -> int:
        """Its tests that pass. A passing exercise passes all of them: here, or (`alone`) when rerun
        with the reference in place of the learner's other exercises."""
        return len(self.tests) if self.status == PASSING else sum(t.ok for t in self.tests)

    @property
    def alone(self) -> bool:
        """Passing, although some of its tests failed in this run: they passed when it was rerun on
        its own."""
        return self.status == PASSING and any(not t.ok for t in self.tests)

    def where(self, test: TestResult) -> str | None:
        """The learner's line to look at for this exercise's failed `test`: the traceback's
        innermost
        learner line, only when it is in this exercise's own code (or a helper it called)."""
        return test.where if test.where and where_owner(test.where) == self.attr else None


_WHERE = re.compile(r", line \d+, in (\w+)(?: \(called from (\w+)\))?(?::|$)")


def where_owner(where: str) -> str | None:
    """The exercise function a `where` line (plugin._learner_frame) belongs to: the function it is
    in,
    or for a helper, the exercise function that called it."""
    m = _WHERE.search(where)
    return (m.group(2) or m.group(1)) if m else None


@dataclass
class Verdict:
    chapters: List[str]
    # "learner" | "solution" | "variant <name>" | "hints"; the self-check: "reference" | "stub" |
    # "variant"
    mode: str
    origin: str  # where the code came from
    device: str
    exercises: List[ExerciseVerdict]
    tests: List[TestResult]  # every test, in run order
    general: List[str]
    wall: float

    @property
    def passed(self) -> bool:
        return self._all_pass(self.tests, self.exercises)

    def passed_in(self, chapter: Chapter) -> bool:
        """Whether this chapter's own tests and exercises all passed (a cumulative run judges
        several)."""
        return self._all_pass(
            self.tests_of(chapter), [e for e in self.exercises if e.chapter == chapter.key]
        )

    def tests_of(self, chapter: Chapter) -> List[TestResult]:
        files = {f.name for f in chapter.test_files}
        return [t for t in self.tests if t.test.split("::")[0].rsplit("/", 1)[-1] in files]

    def _all_pass(self, tests: Sequence[TestResult], exercises: Sequence[ExerciseVerdict]) -> bool:
        return (
            not self.general
            and bool(tests)
            and all(t.ok for t in tests)
            and all(e.status in (PASSING, NO_TESTS, REFERENCE) for e in exercises)
        )

    @property
    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for t in self.tests:
            out[t.outcome] = out.get(t.outcome, 0) + 1
        return out


def path_env(units: Sequence[UnitSpec], chapters: Sequence[Chapter]) -> Dict[str, str]:
    """The environment the test process needs for the learner's code to be what runs: on a GPU the
    engine has fast paths (Triton kernels) that skip some plain-torch functions a learner replaces,
    so an exercise swapped in brings its registry `engine_env` (e.g. MINISGL_FUSED_KERNELS =
    "0")."""
    by_id = {ex.id: ex for c in chapters for ex in c.exercises}
    env: Dict[str, str] = {}
    for unit in units:
        for ex in unit.exercises:
            if ex.swap and ex.id in by_id:
                env.update(dict(by_id[ex.id].engine_env))
    return env


def spec_unit(code: LearnerCode, chapter: Chapter) -> UnitSpec:
    """What the test process swaps from: the snippets and, per exercise, whether to swap it and
    what is already known to be wrong with it."""
    exercises = [
        ExerciseSpec(
            id=ex.id,
            name=ex.name,
            target=ex.target,
            swap=code.swaps(ex.name),
            problem=code.problems.get(ex.name),
            tests=list(ex.tests),
            attempted=code.attempted.get(ex.name, True),
        )
        for ex in chapter.exercises
    ]
    snippets = [SnippetSpec(s.label, s.source, s.exercise) for s in code.snippets]
    return UnitSpec(chapter.key, code.origin, code.missing, snippets, exercises)


def judge(
    chapters: Sequence[Chapter],
    codes: Dict[str, LearnerCode | None],
    options: RunOptions,
    mode: str = "learner",
    origin: str = "",
    selectors: Sequence[str] | None = None,
) -> Verdict:
    """Run the tests of `chapters` (or only `selectors`, 'file::test' ids) with `codes[chapter]`
    swapped in (None: the reference stays)."""
    check_requirements(chapters)
    filtered = selectors is not None or bool(options.keyword)
    start = time.monotonic()
    units = [spec_unit(codes[c.key], c) for c in chapters if codes.get(c.key) is not None]
    files: List[str] = (
        list(selectors)
        if selectors is not None
        else [str(f) for c in chapters for f in c.test_files]
    )
    general: List[str] = []
    for c in chapters:
        code = codes.get(c.key)
        if code is not None:
            general += [f"{c.key}: {g}" if len(chapters) > 1 else g for g in code.general_problems]
        if not c.test_files:
            general.append(f"{c.key} has no test files in the registry")
    extra_env = path_env(units, chapters)
    if extra_env:
        options = dataclasses.replace(options, env={**options.env, **extra_env})
    if not options.packages:  # the time a test spends in these counts against its budget
        packages = sorted({e.target.split(".")[0] for c in chapters for e in c.exercises})
        options = dataclasses.replace(options, packages=tuple(packages))
    server = (
        _fork_server(units, chapters, options) if mode == "learner" and len(chapters) == 1 else None
    )
    if server is not None:
        options = dataclasses.replace(options, launcher=server)
    try:
        run = run_pytest(units, files, options) if files else RunResult()
        verdict = Verdict(
            chapters=[c.key for c in chapters],
            mode=mode,
            origin=origin,
            device=options.device,
            exercises=[],
            tests=run.tests,
            general=general + run.general,
            wall=0.0,
        )
        if mode in ("solution", "reference"):
            verdict.general += _stale_budgets(run)
        if any("triton" in c.requires for c in chapters):
            _hint_kernel_crashes(run.tests)
        for c in chapters:
            for ex in c.exercises:
                verdict.exercises.append(_exercise_verdict(ex, codes.get(c.key), run, filtered))
        if mode == "learner" and len(chapters) == 1:
            _blame(verdict, units, chapters[0], options, deadline=start + options.time_limit)
    finally:
        if server is not None:
            server.close()
    verdict.wall = time.monotonic() - start
    return verdict


def _fork_server(units: List[UnitSpec], chapters: Sequence[Chapter], options: RunOptions):
    """A learner's run forks its test processes from one server that has imported torch and the
    engine once (forkserver.py): a rerun of failing exercises (_blame), or the restart after a
    test that hung or crashed, then starts in a fraction of a second instead of the seconds of
    imports (about 8 s on the H200), and the first run costs what a fresh process would. None
    where no test of the learner's will run (all stubs), or where it cannot fork
    (forkserver.server_for says when, a GPU included)."""
    from . import forkserver

    attempted = [e for u in units for e in u.exercises if e.swap and e.attempted and not e.problem]
    if options.launcher is not None or not forkserver.available() or not attempted:
        return None
    modules = sorted({e.module for c in chapters for e in c.exercises})
    return forkserver.server_for(options.device, modules, references=False)


def not_attempted(chapters: Sequence[Chapter], origin: str, device: str) -> Verdict:
    """The verdict of code whose exercises are all still their stubs: every one not attempted, no
    test run (the terminal's and the notebook's judge give it without starting pytest)."""
    exercises = [
        ExerciseVerdict(c.key, e.name, e.target, NOT_ATTEMPTED)
        for c in chapters
        for e in c.exercises
    ]
    return Verdict([c.key for c in chapters], "learner", origin, device, exercises, [], [], 0.0)


KERNEL_CRASH_HINT = (
    "; most often a tl.load or tl.store outside its tensor (check the masks), which corrupts "
    "memory and may crash a later test than its own"
)
AFTER_A_CRASH = " (in a test process that then crashed: its memory may already have been corrupted)"


def _hint_kernel_crashes(tests: Sequence[TestResult]) -> None:
    """A Triton kernel that loads or stores past a tensor's end corrupts the process's memory in
    the interpreter (`free(): invalid pointer`, a SIGABRT or SIGSEGV, in this test or a later one,
    or a stray error before) and is an illegal address on a GPU: in a chapter of kernels a crash
    says where to look, and a failure in the process that crashed says it may be the crash's."""
    for t in tests:
        message = t.message or ""
        if t.outcome == "crashed" and not message.endswith(KERNEL_CRASH_HINT):
            t.message = (message or "the test process crashed") + KERNEL_CRASH_HINT
        elif (
            t.process_died
            and t.outcome in ("failed", "error")
            and not message.startswith("not run: ")
            and not message.endswith(AFTER_A_CRASH)
        ):
            t.message = message + AFTER_A_CRASH


def _stale_budgets(run: RunResult) -> List[str]:
    """A reference run that spent more than a test's time budget: the budgets file is stale."""
    if not run.over_budget:
        return []
    tests = ", ".join(t.split("::", 1)[-1] for t in list(run.over_budget)[:3]) + (
        " ..." if len(run.over_budget) > 3 else ""
    )
    return [
        f"the reference spent more than its time budget in {len(run.over_budget)} test(s) "
        f"({tests}): "
        "the budgets are stale; measure them again with `python -m judge.measure_budgets`"
    ]


def _selector(nodeid: str, chapter: Chapter) -> str:
    """A test's node id as a path pytest finds from anywhere: the chapter's test file, absolute."""
    file, _, rest = nodeid.partition("::")
    path = next((f for f in chapter.test_files if f.name == Path(file).name), Path(file))
    return f"{path}::{rest}"


def _blame(
    verdict: Verdict, units: List[UnitSpec], chapter: Chapter, options: RunOptions, deadline: float
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

    def passes(exercises: List[ExerciseVerdict], stop: bool, jobs: int = options.jobs) -> bool:
        left = deadline - time.monotonic()
        if left < 1:
            return False
        failed = sorted(
            {_selector(t.test, chapter) for ex in exercises for t in ex.tests if not t.ok}
        )
        run = run_pytest(
            [u.only([ex.id for ex in exercises]) for u in units],
            failed,
            dataclasses.replace(options, time_limit=left, stop_at_first_failure=stop, jobs=jobs),
        )
        return bool(run.tests) and not run.general and all(t.ok for t in run.tests)

    def cleared(ex: ExerciseVerdict, instead: str) -> None:
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

    if known and len(rerun) > 1 and passes(rerun, stop=True):
        names = ", ".join(e.name for e in known)
        for ex in rerun:
            cleared(ex, names)
        return

    workers = max(1, min(len(rerun), os.cpu_count() or 1))

    def alone(ex: ExerciseVerdict) -> None:  # the run's processes shared among the reruns
        if passes([ex], stop=True, jobs=max(1, options.jobs // workers)):
            cleared(ex, "your other exercises")

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


def _exercise_verdict(
    ex: Exercise, code: LearnerCode | None, run: RunResult, filtered: bool
) -> ExerciseVerdict:
    tests = [t for t in run.tests if ex.judges(t.test)]
    v = ExerciseVerdict(ex.chapter, ex.name, ex.target, PASSING, tests=tests)
    if code is None or not code.swaps(ex.name):
        v.status = REFERENCE
        v.note = code.notes.get(ex.name) if code is not None else None
        return v
    v.problem = run.problems.get(ex.id) or code.problems.get(ex.name)
    v.attempted = code.attempted.get(ex.name, True)
    if v.problem is not None and not (v.attempted is False and "NotImplementedError" in v.problem):
        v.status = ERROR
    elif not v.attempted:
        v.status = NOT_ATTEMPTED
    elif not ex.tests:
        v.status = NO_TESTS
    elif not tests:  # none of its tests ran: selected out (-k), or the run broke down
        v.status = ERROR if not filtered and (run.general or run.tests) else NO_TESTS
        if v.status == ERROR and v.problem is None:
            v.problem = "its tests did not run"
    elif all(t.ok for t in tests):
        v.status = PASSING
    else:
        v.status = FAILING
    return v
