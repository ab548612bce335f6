"""What a judge run is asked to do (`RunOptions`) and what it gives back (`TestResult` per test,
`RunResult` for the run): the types runner.py, pytest_process.py and event_replay.py share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple


@dataclass
class RunOptions:
    device: str = "cpu"  # cpu | cuda | auto
    test_timeout: float | None = (
        None  # per test, hard cap, seconds; None: 60 on a CPU, 120 where a GPU may be
    )
    time_limit: float | None = None  # whole run, seconds; None: 900
    keyword: str | None = None  # pytest -k
    threads: int | None = None  # torch/OpenMP threads in the subprocess (None: its default)
    env: Dict[str, str] = field(default_factory=dict)
    launcher: Any = (
        None  # a forkserver.ForkServer to fork the test process from (judging._fork_server)
    )
    stop_at_first_failure: bool = (
        False  # pytest -x: mutation testing needs one failing test, not all
    )
    budgets: Dict | None = None  # the budgets file's content; None: read budgets.json (budgets.py)
    # test processes running shares of the tests at once (shards.py); default_jobs() for a
    # learner's run, 1 where runs already go in parallel (the self-check, mutation testing) or
    # are timed (measure_budgets)
    jobs: int = 1
    # the first collected test run last: judge.measure_budgets times it without the process's
    # one-off start, which the first test of every process pays
    first_last: bool = False
    packages: Tuple[
        str, ...
    ] = ()  # whose running time counts against a budget; (): the targets' packages

    def __post_init__(self) -> None:
        if self.test_timeout is None:
            self.test_timeout = 60.0 if self.device == "cpu" else 120.0
        if self.time_limit is None:
            self.time_limit = 900.0


@dataclass
class TestResult:
    test: str  # pytest node id
    outcome: str  # passed | failed | error | skipped | timeout | crashed
    duration: float = 0.0
    message: str | None = None
    sentinel: str | None = (
        None  # "chNN.name" when the exercise stub's NotImplementedError caused it
    )
    standin: bool = False  # failed because an exercise's code could not be put in place
    where: str | None = None  # the learner's line the failure came from
    culprit: str | None = None  # a timeout: the exercise ("chNN.name") whose code was running
    cpu: float | None = None  # the test process's CPU time in the test (budgets.py measures by it)
    # run in a test process that then crashed, or not run since it had: code that corrupts the
    # process (a kernel writing past a tensor's end) may fail or crash a later test of another
    # exercise, so rerun_alone.py reruns such tests without it
    process_died: bool = False

    __test__ = False  # not a pytest test class

    @property
    def ok(self) -> bool:
        return self.outcome in ("passed", "skipped")


@dataclass
class RunResult:
    tests: List[TestResult] = field(default_factory=list)
    # exercise id -> why its code is not in place
    problems: Dict[str, str] = field(default_factory=dict)
    general: List[str] = field(default_factory=list)  # problems not tied to a test
    collected: List[str] = field(default_factory=list)
    output_tail: str = ""
    # a reference run: test -> budget it passed
    over_budget: Dict[str, float] = field(default_factory=dict)
    order: List[str] = field(default_factory=list)  # a sharded run: the whole collection's order
