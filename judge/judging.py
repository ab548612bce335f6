"""From learner code to a verdict: build the subprocess's swap spec, run the chapter's tests, and
sort the outcomes per exercise."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

from .registry import Chapter, Exercise
from .runner import RunOptions, RunResult, TestResult, run_pytest
from .sources import LearnerCode

# An exercise's status, in the order a learner cares about them.
PASSING, FAILING, NOT_ATTEMPTED, ERROR, NO_TESTS, REFERENCE = (
    "passing", "failing", "not attempted", "error", "no tests", "reference")


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
    def passed_count(self) -> int:
        return sum(t.ok for t in self.tests)


@dataclass
class Verdict:
    chapters: List[str]
    mode: str  # "learner" | "solution" | "variant <name>" | "hints"; the self-check: "reference" | "stub" | "variant"
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
        """Whether this chapter's own tests and exercises all passed (a cumulative run judges several)."""
        return self._all_pass(self.tests_of(chapter), [e for e in self.exercises if e.chapter == chapter.key])

    def tests_of(self, chapter: Chapter) -> List[TestResult]:
        files = {f.name for f in chapter.test_files}
        return [t for t in self.tests if t.test.split("::")[0].rsplit("/", 1)[-1] in files]

    def _all_pass(self, tests: Sequence[TestResult], exercises: Sequence[ExerciseVerdict]) -> bool:
        return (not self.general and bool(tests) and all(t.ok for t in tests)
                and all(e.status in (PASSING, NO_TESTS, REFERENCE) for e in exercises))

    @property
    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for t in self.tests:
            out[t.outcome] = out.get(t.outcome, 0) + 1
        return out



# On a GPU the engine has fast paths (Triton kernels) that skip some of the plain-torch functions a
# learner replaces. When learner code replaces a function of one of these modules, the test process
# gets the environment that keeps the plain-torch path, so the learner's code is what runs.
KEEP_REFERENCE_PATH = {
    "minisgl.kernel.ops": {"MINISGL_FUSED_KERNELS": "0"},
    "minisgl.kvcache.pool": {"MINISGL_FUSED_KERNELS": "0"},  # the fused kernel stores K/V itself
    "minisgl.attention.torch_backend": {"MINISGL_ATTENTION_BACKEND": "torch"},
}


def path_env(units: Sequence[Dict]) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for unit in units:
        for ex in unit["exercises"]:
            if ex["swap"]:
                env.update(KEEP_REFERENCE_PATH.get(ex["target"].split(":")[0], {}))
    return env


def spec_unit(code: LearnerCode, chapter: Chapter) -> Dict:
    """The JSON the subprocess swaps from: the snippets and, per exercise, whether to swap it and
    what is already known to be wrong with it."""
    exercises = []
    for ex in chapter.exercises:
        exercises.append({"id": ex.id, "name": ex.name, "target": ex.target, "swap": code.swaps(ex.name),
                          "problem": code.problems.get(ex.name)})
    snippets = [{"label": s.label, "source": s.source, "exercise": s.exercise} for s in code.snippets]
    return {"chapter": chapter.key, "origin": code.origin, "missing": code.missing,
            "snippets": snippets, "exercises": exercises}


def judge(chapters: Sequence[Chapter], codes: Dict[str, LearnerCode | None], options: RunOptions,
          mode: str = "learner", origin: str = "", selectors: Sequence[str] | None = None) -> Verdict:
    """Run the tests of `chapters` (or only `selectors`, 'file::test' ids) with `codes[chapter]`
    swapped in (None: the reference stays)."""
    filtered = selectors is not None or bool(options.keyword)
    start = time.monotonic()
    units = [spec_unit(codes[c.key], c) for c in chapters if codes.get(c.key) is not None]
    files: List[str] = list(selectors) if selectors is not None else [str(f) for c in chapters for f in c.test_files]
    general: List[str] = []
    for c in chapters:
        code = codes.get(c.key)
        if code is not None:
            general += [f"{c.key}: {g}" if len(chapters) > 1 else g for g in code.general_problems]
        if not c.test_files:
            general.append(f"{c.key} has no test files in the registry")
    extra_env = path_env(units)
    if extra_env:
        options = dataclasses.replace(options, env={**options.env, **extra_env})
    run = run_pytest(units, files, options) if files else RunResult()
    verdict = Verdict(chapters=[c.key for c in chapters], mode=mode, origin=origin, device=options.device,
                      exercises=[], tests=run.tests, general=general + run.general, wall=0.0)
    for c in chapters:
        for ex in c.exercises:
            verdict.exercises.append(_exercise_verdict(ex, codes.get(c.key), run, filtered))
    if mode == "learner" and len(chapters) == 1:
        _blame(verdict, units, chapters[0], options, deadline=start + options.time_limit)
    verdict.wall = time.monotonic() - start
    return verdict


def _only(unit: Dict, exercise_id: str) -> Dict:
    """The swap spec with one exercise swapped in and every other one left to the reference."""
    exercises = [{**e, "swap": e["swap"] and e["id"] == exercise_id} for e in unit["exercises"]]
    return {**unit, "exercises": exercises}


def _selector(nodeid: str, chapter: Chapter) -> str:
    """A test's node id as a path pytest finds from anywhere: the chapter's test file, absolute."""
    file, _, rest = nodeid.partition("::")
    path = next((f for f in chapter.test_files if f.name == Path(file).name), Path(file))
    return f"{path}::{rest}"


def _blame(verdict: Verdict, units: List[Dict], chapter: Chapter, options: RunOptions, deadline: float) -> None:
    """A test that goes through the whole engine judges several exercises at once, so one wrong
    function fails the tests of its neighbours too. When more than one exercise is failing, rerun
    each one's failed tests with only that exercise swapped in: one whose tests then pass is
    correct, and is reported as passing. The reruns share what is left of the run's time limit;
    an exercise not rerun in time stays failing."""
    failing = [e for e in verdict.exercises if e.status == FAILING]
    if len(failing) < 2:
        return
    for ex in failing:
        left = deadline - time.monotonic()
        if left < 1:
            return
        failed = [_selector(t.test, chapter) for t in ex.tests if not t.ok]
        alone = run_pytest([_only(u, ex.id) for u in units], failed, dataclasses.replace(options, time_limit=left))
        if alone.tests and not alone.general and all(t.ok for t in alone.tests):
            ex.status = PASSING
            ex.note = (f"correct on its own: its {len(failed)} failed test(s) pass with the reference "
                       "in place of your other exercises")


def _exercise_verdict(ex: Exercise, code: LearnerCode | None, run: RunResult, filtered: bool) -> ExerciseVerdict:
    tests = [t for t in run.tests if ex.judges(t.test)]
    v = ExerciseVerdict(ex.chapter, ex.name, ex.target, PASSING, tests=tests)
    if code is None or not code.swaps(ex.name):
        v.status = REFERENCE
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
