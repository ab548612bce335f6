"""What the judge's two halves say to each other: the parent (runner.py) writes a `RunSpec` as a
JSON file whose path is in MINISGL_JUDGE_SPEC; the test process (plugin.py, swap.py, timer.py) reads
it, and appends one `Event` per line to the spec's results file, flushed at once, so that what
happened survives a test that ends the process. Both halves import these types, so a field is named
once.

Plain dataclasses and `json`: the test process imports this before torch, and it must stay light.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Sequence, Type

# ---------------------------------------------------------------------- the spec (parent -> child)


@dataclass
class SnippetSpec:
    label: str  # the file name tracebacks show ("ch11_overlap.ipynb cell 14")
    source: str
    exercise: str | None = (
        None  # the exercise it defines; None: support code every exercise may use
    )


@dataclass
class ExerciseSpec:
    id: str  # "chNN.name"
    name: str
    target: str  # "package.module:Class.attr"
    swap: bool  # put the learner's code in place (False: the reference stays)
    problem: str | None = (
        None  # already known to be unusable (sources.py found it): a stand-in goes in
    )
    tests: List[str] = field(default_factory=list)  # the registry's tests of this exercise
    attempted: bool = True  # False: still the stub
    # error class name -> the rule's words (registry.Exercise.raises)
    raises: Dict[str, str] = field(default_factory=dict)

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def attr(self) -> str:
        return self.target.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


@dataclass
class UnitSpec:
    """One chapter's learner code and its exercises."""

    chapter: str
    origin: str
    missing: str  # "error": an exercise the code does not define is an error; "reference": it stays
    snippets: List[SnippetSpec] = field(default_factory=list)
    exercises: List[ExerciseSpec] = field(default_factory=list)

    def only(self, exercise_ids: Sequence[str]) -> "UnitSpec":
        """This unit with only these exercises swapped in; every other one is left to the
        reference."""
        keep = set(exercise_ids)
        return dataclasses.replace(
            self,
            exercises=[
                dataclasses.replace(e, swap=e.swap and e.id in keep) for e in self.exercises
            ],
        )


@dataclass
class BudgetSpec:
    """Each test's time budget (budgets.py) and whose running time counts against it (timer.py)."""

    measured: Dict[str, float]  # test key -> the reference's CPU seconds
    floor: float
    factor: float
    default: float  # a test with no measured time
    hard: float  # the hard cap on a test's wall time
    wait: float = 10.0  # wall seconds the learner's code may wait, blocked, in a test (timer.py)
    not_counted: List[str] = field(default_factory=list)  # packages whose time is never counted
    packages: List[str] = field(default_factory=list)  # packages whose time counts
    # test file -> seconds the first test of a process spends on its one-off start (budgets.py)
    first_test: Dict[str, float] = field(default_factory=dict)

    def limit(self, key: str, first: bool = False) -> float:
        """The budget in seconds of the test whose key (budgets.test_key) is `key`; `first`: the
        process's first test, which also pays for its one-off start (not multiplied: it is the
        engine's start-up, not the learner's code)."""
        measured = self.measured.get(key)
        budget = self.default if measured is None else max(self.floor, self.factor * measured)
        start = self.first_test.get(key.split("::")[0], 0.0) if first else 0.0
        return min(budget + start, self.hard)


@dataclass
class RunSpec:
    results: str  # the events file the child appends to
    units: List[UnitSpec] = field(default_factory=list)
    test_dirs: List[str] = field(default_factory=list)
    # tests of an earlier, interrupted attempt: not run again
    done: List[str] = field(default_factory=list)
    device: str = "cpu"
    # exercise id -> the test it timed out in
    timed_out: Dict[str, str] = field(default_factory=dict)
    budget: BudgetSpec | None = None  # None: no budgets (no signals here), only the hard cap
    # [i, n]: run only the i-th of n shares of the collected tests (runner.py runs n processes at
    # once); [0, 1]: all of them
    shard: List[int] = field(default_factory=lambda: [0, 1])
    # a sharded run: the file every share appends its timeouts to and reads before each test
    # (timer.py), so an exercise that hung in one share is not run again in another
    shared_timeouts: str = ""
    # run the first collected test last (measure_budgets: its time without the process's start)
    first_last: bool = False

    @property
    def swapped(self) -> List[ExerciseSpec]:
        return [e for u in self.units for e in u.exercises if e.swap]

    @property
    def snippets(self) -> List[SnippetSpec]:
        return [s for u in self.units for s in u.snippets]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        data = json.loads(text)
        units = [
            UnitSpec(
                **{
                    **u,
                    "snippets": [SnippetSpec(**s) for s in u["snippets"]],
                    "exercises": [ExerciseSpec(**e) for e in u["exercises"]],
                }
            )
            for u in data.pop("units", [])
        ]
        budget = data.pop("budget", None)
        return cls(**data, units=units, budget=BudgetSpec(**budget) if budget is not None else None)

    def write(self, path: Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> "RunSpec":
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


# ---------------------------------------------------------------------- the events (child ->
# parent)


@dataclass
class Event:
    kind: ClassVar[str] = ""

    def to_json(self) -> str:
        return json.dumps({"event": self.kind, **dataclasses.asdict(self)})


@dataclass
class Swapped(Event):
    """The learner's code is in place (or stand-ins where it could not be)."""

    kind: ClassVar[str] = "swapped"
    # exercise id -> why its code is not in place
    problems: Dict[str, str] = field(default_factory=dict)
    general: List[str] = field(default_factory=list)  # problems not tied to one exercise


@dataclass
class Collected(Event):
    kind: ClassVar[str] = "collected"
    tests: List[str] = field(default_factory=list)  # node ids, in run order
    # a shard's process: the whole collection, in run order (how shards' results are merged)
    order: List[str] = field(default_factory=list)


@dataclass
class CollectError(Event):
    kind: ClassVar[str] = "collect_error"
    where: str = ""
    message: str = ""


@dataclass
class Start(Event):
    kind: ClassVar[str] = "start"
    test: str = ""


@dataclass
class Result(Event):
    """A test's outcome: passed | failed | error | skipped | timeout."""

    kind: ClassVar[str] = "result"
    test: str = ""
    outcome: str = "passed"
    duration: float = 0.0
    message: str | None = None  # one short line or three: what was expected, what happened
    sentinel: str | None = (
        None  # "chNN.name" when the exercise stub's NotImplementedError caused it
    )
    standin: bool = False  # failed because an exercise's code could not be put in place
    where: str | None = None  # the learner's line the failure came from
    culprit: str | None = None  # a timeout: the exercise whose code was running


@dataclass
class CpuTime(Event):
    """timer.py: the test process's CPU time in the test (budgets are measured by it)."""

    kind: ClassVar[str] = "cpu_time"
    test: str = ""
    seconds: float = 0.0


@dataclass
class OverBudget(Event):
    """timer.py: a reference run spent more than a test's budget (the budgets are stale)."""

    kind: ClassVar[str] = "over_budget"
    test: str = ""
    budget: float = 0.0


@dataclass
class Finished(Event):
    kind: ClassVar[str] = "finished"


@dataclass
class Fatal(Event):
    """Nothing can be judged in this process (e.g. --device cuda with no GPU)."""

    kind: ClassVar[str] = "fatal"
    message: str = ""


EVENTS: Dict[str, Type[Event]] = {
    c.kind: c
    for c in (Swapped, Collected, CollectError, Start, Result, CpuTime, OverBudget, Finished, Fatal)
}


def event_from_json(line: str) -> Event | None:
    """The event of one line of the results file; None for a line cut short by a kill, or
    unknown."""
    try:
        data: Dict[str, Any] = json.loads(line)
        return EVENTS[data.pop("event")](**data)
    except (ValueError, KeyError, TypeError):
        return None


def read_events(path: Path) -> List[Event]:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [ev for ev in map(event_from_json, text.splitlines()) if ev is not None]
