"""Running pytest in a fresh subprocess with the learner's code swapped in (plugin.py does the
swap).

One process is three steps: `_build` writes the spec (protocol.RunSpec) and puts together the
command and environment, `_launch` starts it (forked from a server when the run has one), `_replay`
reads the events it wrote (protocol.py) into the run's result.

The subprocess gets its own process group, a wall-clock limit (the whole group is killed when it
runs out), and its output is drained by a thread that keeps only the end of it. Each test has a
time budget from the reference's measured time (budgets.py; timer.py stops it), under the hard
cap `test_timeout`. If the process dies in the middle of a test (`os._exit`, a crash), the test it
was running is reported as such and pytest is started again on the tests not yet run, a few times
at most.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from . import budgets as budgets_file
from . import settings
from .child_process import exit_reason, file_tail, popen
from .protocol import (
    Collected,
    CollectError,
    CpuTime,
    Event,
    Fatal,
    Finished,
    OverBudget,
    Result,
    RunSpec,
    Start,
    Swapped,
    UnitSpec,
    read_events,
)
from .registry import REPO

SPEC_ENV = settings.SPEC.name  # the spec file's path, for the test process (plugin.py)

# What pytest-timeout's thread method prints before it ends the process with os._exit(1).
_PYTEST_TIMEOUT_EXIT = re.compile(r"\+{3,} Timeout \+{3,}\s*$")
MAX_RESTARTS = 3
MAX_JOBS = 4


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
    # exercise, so judging._blame reruns such tests without it
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


def default_jobs(device: str) -> int:
    """How many test processes a learner's run uses: MINISGL_JUDGE_JOBS, else on a CPU one per
    core this process may use, at most MAX_JOBS (each process imports torch and builds its first
    engine again: more shares than that cost more than they save on a chapter's few dozen tests);
    on a GPU one, since its processes would share the device and each start a CUDA context."""
    chosen = settings.JOBS.read()
    if chosen != "auto":
        return chosen
    if device != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_JOBS, cores or 1))


def run_pytest(
    units: List[UnitSpec], test_files: Sequence[str | Path], options: RunOptions
) -> RunResult:
    """Run the tests (files, or 'file::test' node ids) with the units' code swapped in; never raises
    for anything learner code does. With `options.jobs` > 1, that many processes at once, each on
    its share of the tests (shards.py), and their results merged in the tests' collected order:
    a test that hangs or crashes one process holds up only that share."""
    count = options.jobs
    if all("::" in str(f) for f in test_files):  # named tests: no more shares than tests
        count = min(count, len(test_files))
    if count <= 1:
        return _run_share(units, test_files, options, [0, 1])
    shared = Path(tempfile.mkdtemp(prefix="minisgl-judge-shares-"))
    try:
        timeouts = str(shared / "timeouts.tsv")
        with ThreadPoolExecutor(count) as pool:
            shares = list(
                pool.map(
                    lambda i: _run_share(units, test_files, options, [i, count], timeouts),
                    range(count),
                )
            )
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    return _merge(shares)


def _merge(shares: List[RunResult]) -> RunResult:
    order = next((s.order for s in shares if s.order), [])
    rank = {t: i for i, t in enumerate(order)}
    merged = RunResult(order=order)
    for s in shares:
        merged.tests += s.tests
        merged.problems.update(s.problems)
        merged.general += [g for g in s.general if g not in merged.general]
        merged.collected += s.collected
        merged.over_budget.update(s.over_budget)
    last = len(order)  # a test only a share knows of (reported, never collected) goes last
    merged.tests.sort(key=lambda t: rank.get(t.test, last))
    merged.collected.sort(key=lambda t: rank.get(t, last))
    merged.output_tail = "\n".join(s.output_tail for s in shares if s.output_tail)
    return merged


def _run_share(
    units: List[UnitSpec],
    test_files: Sequence[str | Path],
    options: RunOptions,
    shard: List[int],
    shared_timeouts: str = "",
) -> RunResult:
    start = time.monotonic()
    result = RunResult()
    missing = sorted({_file_of(f) for f in test_files if not Path(_file_of(f)).is_file()})
    if missing:
        result.general.append(
            "test file(s) not found: " + ", ".join(_rel(Path(m)) for m in missing)
        )
        return result
    tmp = Path(tempfile.mkdtemp(prefix="minisgl-judge-"))
    try:
        done: List[str] = []
        for attempt in range(MAX_RESTARTS + 1):
            left = options.time_limit - (time.monotonic() - start)
            if left <= 1:
                result.general.append(
                    f"the run was stopped after its time limit of {options.time_limit:.0f} s"
                )
                break
            finished = _one_process(
                units, test_files, options, tmp, attempt, done, left, result, shard, shared_timeouts
            )
            if finished:
                break
        else:
            result.general.append(
                f"the test process died {MAX_RESTARTS + 1} times; the remaining tests were not run"
            )
        not_run = [t for t in result.collected if t not in {r.test for r in result.tests}]
        died = any(r.process_died for r in result.tests)
        for t in not_run:
            result.tests.append(
                TestResult(
                    t, "error", message="not run: the test process had stopped", process_died=died
                )
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


@dataclass
class _Launch:
    """One pytest process, ready to start: its command line, environment and files."""

    cmd: List[str]
    env: Dict[str, str]
    results: Path  # where the process appends its events (protocol.py)
    output: Path  # where a forked process's output goes


def _one_process(
    units: List[UnitSpec],
    test_files,
    options: RunOptions,
    tmp: Path,
    attempt: int,
    done: List[str],
    time_left: float,
    result: RunResult,
    shard: List[int],
    shared_timeouts: str,
) -> bool:
    """One pytest process. Returns True when no further attempt is needed."""
    launch = _build(units, test_files, options, tmp, attempt, done, result, shard, shared_timeouts)
    returncode, killed, result.output_tail = _launch(launch, options, time_left)
    return _replay(read_events(launch.results), returncode, killed, options, done, result)


def _build(
    units: List[UnitSpec],
    test_files,
    options: RunOptions,
    tmp: Path,
    attempt: int,
    done: List[str],
    result: RunResult,
    shard: List[int],
    shared_timeouts: str,
) -> _Launch:
    """Write the spec (what to swap, which tests are already done, the budgets) and put together the
    command line and environment of one pytest process."""
    results_path = tmp / f"results{attempt}.jsonl"
    spec_path = tmp / f"spec{attempt}.json"
    test_dirs = sorted({str(Path(_file_of(f)).resolve().parent) for f in test_files})
    spec = RunSpec(
        results=str(results_path),
        units=units,
        test_dirs=test_dirs,
        done=list(done),
        device=options.device,
        timed_out=_timed_out(result.tests, units),
        shard=shard,
        shared_timeouts=shared_timeouts,
        first_last=options.first_last,
    )
    if _timer_usable():
        data = options.budgets if options.budgets is not None else budgets_file.load()
        packages = (
            options.packages
            or sorted({e.target.split(".")[0] for u in units for e in u.exercises})
            or ["minisgl"]
        )
        spec.budget = budgets_file.Budgets(data, options.device, options.test_timeout).spec(
            packages
        )
    spec.write(spec_path)
    results_path.touch()

    files = [Path(_file_of(f)).resolve() for f in test_files]
    # pytest names tests relative to its rootdir, and not at all outside it.
    rootdir = (
        REPO
        if all(_inside(f, REPO) for f in files)
        else Path(os.path.commonpath([f.parent for f in files]))
    )
    # no:unraisableexception: at exit it runs gc.collect() five times, seconds with torch loaded.
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "judge.plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:unraisableexception",
        "-q",
        "--tb=no",
        "--show-capture=no",
        "--no-header",
        "-o",
        "console_output_style=classic",
        "--rootdir",
        str(rootdir),
        "-c",
        str(REPO / "pyproject.toml"),
    ]
    if _timer_usable():
        cmd += ["-p", "judge.timer"]  # budgets and the hard cap
    elif _has_pytest_timeout():  # no signals to interrupt a test with (Windows): the hard cap only
        cmd += [
            "-p",
            "pytest_timeout",
            f"--timeout={options.test_timeout:g}",
            f"--timeout-method={_timeout_method()}",
        ]
    repo_tests = (REPO / "tests").resolve()
    if any(f.parent == repo_tests for f in files):
        cmd += ["--device", options.device]  # the repo's conftest defines it
    if options.keyword:
        cmd += ["-k", options.keyword]
    if options.stop_at_first_failure:
        cmd += ["-x"]
    cmd += [str(f) for f in test_files]

    env = dict(os.environ)
    env.update(options.env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the judge writes nothing into the learner's checkout
    env["PYTHONUNBUFFERED"] = "1"
    # Installed pytest plugins (nbval, benchmark, ...) cost seconds to import and judge nothing.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env[SPEC_ENV] = str(spec_path)
    env.setdefault("MINISGL_TEST_DEVICE", options.device)
    if options.device == "cpu":  # Triton kernels on CPU tensors run only in its interpreter
        env.setdefault("TRITON_INTERPRET", "1")
    if options.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(options.threads)
    return _Launch(cmd, env, results_path, tmp / f"output{attempt}.txt")


def _launch(launch: _Launch, options: RunOptions, time_left: float):
    """(exit code, killed on time, output tail): forked from the run's server when it has one, else
    a fresh subprocess."""
    if options.launcher is not None and options.launcher.ready:
        try:
            returncode, killed = options.launcher.run(
                launch.cmd[3:],
                launch.env,
                str(REPO),
                str(launch.output),
                time_left,
                options.threads,
            )
            return returncode, killed, file_tail(launch.output)
        except RuntimeError:
            pass  # the server is gone: start the process afresh
    return popen(launch.cmd, launch.env, time_left)


def _replay(
    events: List[Event],
    returncode: int | None,
    killed: bool,
    options: RunOptions,
    done: List[str],
    result: RunResult,
) -> bool:
    """Fold one process's events into `result`; after a process that did not finish, report the test
    it was in. Returns True when no further attempt is needed."""
    started: str | None = None
    finished = False
    first = len(result.tests)
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
            return True
    if finished:
        return True
    if not killed:
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
            TestResult(started, outcome, message=message, process_died=outcome == "crashed")
        )
        done.append(started)
        return killed  # after a kill, the time is up; after a crash, go on with the rest
    if not any(isinstance(ev, Swapped) for ev in events):
        why += " while loading your code"
    result.general.append(why + _output_hint(result.output_tail, events))
    return True


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def _timer_usable() -> bool:
    return hasattr(signal, "pthread_kill") and hasattr(signal, "SIGALRM")


def _timed_out(tests: List[TestResult], units: List[UnitSpec]) -> Dict[str, str]:
    """Exercise id -> the test it timed out in, from an earlier attempt (timer.py's rule: the
    exercise whose code was running, else every swapped exercise the test judges)."""
    from .registry import test_matches

    out: Dict[str, str] = {}
    for t in tests:
        if t.outcome != "timeout":
            continue
        ids = (
            [t.culprit]
            if t.culprit
            else [
                e.id
                for u in units
                for e in u.exercises
                if e.swap and any(test_matches(r, t.test) for r in e.tests)
            ]
        )
        for i in ids:
            out.setdefault(i, t.test)
    return out


def _has_pytest_timeout() -> bool:
    import importlib.util

    return importlib.util.find_spec("pytest_timeout") is not None


def _file_of(selector: str | Path) -> str:
    return str(selector).split("::", 1)[0]


def _timeout_method() -> str:
    # signal: the timed-out test fails and the others still run; threads where there are no signals.
    return "signal" if hasattr(signal, "SIGALRM") else "thread"


def _output_hint(tail: str, events) -> str:
    if events or not tail.strip():
        return ""
    last = "\n".join(tail.strip().splitlines()[-8:])
    return f"\n  last output:\n{last}"


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)
