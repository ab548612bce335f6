"""A judged run's verdict: per exercise its status (passing, failing, not attempted, error, no
tests, reference), the tests that judge it and the learner's line to look at; for the run, every
test and the problems not tied to one. Built by judging.py, shown by report.py, recorded by
progress.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

from .registry import Chapter
from .run_results import TestResult

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
    """The exercise function a `where` line (failure_messages.learner_frame) belongs to: the
    function it is in, or for a helper, the exercise function that called it."""
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
