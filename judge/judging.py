"""From learner code to a verdict: build the subprocess's swap spec, run the chapter's tests, and
sort the outcomes per exercise."""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Sequence

from .protocol import ExerciseSpec, SnippetSpec, UnitSpec
from .registry import Chapter, Exercise, check_requirements
from .runner import RunOptions, RunResult, TestResult, run_pytest
from .sources import LearnerCode
from .verdicts import (
    ERROR,
    FAILING,
    NO_TESTS,
    NOT_ATTEMPTED,
    PASSING,
    REFERENCE,
    ExerciseVerdict,
    Verdict,
)

# the verdict's types live in verdicts.py; callers may take them from here with judge()
__all__ = [
    *("ERROR", "FAILING", "NO_TESTS", "NOT_ATTEMPTED", "PASSING", "REFERENCE"),
    *("ExerciseVerdict", "Verdict", "judge", "not_attempted", "path_env", "spec_unit"),
]


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
            raises=dict(ex.raises),
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
    general = _general_problems(chapters, codes)
    options = _with_environment_and_packages(options, units, chapters)
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
        # No blame reruns once the learner's code has killed the fork server: a rerun's process
        # would be started afresh, its parent the judge (the learner's kernel, for judge.check),
        # the next target of the code that killed the server.
        server_killed = server is not None and not server.ready
        if mode == "learner" and len(chapters) == 1 and not server_killed:
            _blame(verdict, units, chapters[0], options, deadline=start + options.time_limit)
    finally:
        if server is not None:
            server.close()
    verdict.wall = time.monotonic() - start
    return verdict


def _general_problems(
    chapters: Sequence[Chapter], codes: Dict[str, LearnerCode | None]
) -> List[str]:
    """Problems of the learner's code not tied to one exercise, and chapters without tests."""
    general: List[str] = []
    for c in chapters:
        code = codes.get(c.key)
        if code is not None:
            general += [f"{c.key}: {g}" if len(chapters) > 1 else g for g in code.general_problems]
        if not c.test_files:
            general.append(f"{c.key} has no test files in the registry")
    return general


def _with_environment_and_packages(
    options: RunOptions, units: List[UnitSpec], chapters: Sequence[Chapter]
) -> RunOptions:
    """The options with the swapped exercises' engine_env (path_env) and, unless given, the
    packages whose running time counts against a test's budget."""
    extra_env = path_env(units, chapters)
    if extra_env:
        options = dataclasses.replace(options, env={**options.env, **extra_env})
    if not options.packages:  # the time a test spends in these counts against its budget
        packages = sorted({e.target.split(".")[0] for c in chapters for e in c.exercises})
        options = dataclasses.replace(options, packages=tuple(packages))
    return options


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


def _blame(
    verdict: Verdict, units: List[UnitSpec], chapter: Chapter, options: RunOptions, deadline: float
) -> None:
    """See rerun_alone.py; the reruns go through this module's run_pytest."""
    from .rerun_alone import rerun_alone

    rerun_alone(verdict, units, chapter, options, deadline, run_pytest)
