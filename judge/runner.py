"""Running pytest in a fresh subprocess with the learner's code swapped in (plugin.py does the
swap).

One process is three steps: `pytest_process.build` writes the spec (protocol.RunSpec) and puts
together the command and environment, `pytest_process.launch` starts it (forked from a server when
the run has one), `event_replay.replay` reads the events it wrote (protocol.py) into the run's
result.

The subprocess gets its own process group, a wall-clock limit (the whole group is killed when it
runs out), and its output is drained by a thread that keeps only the end of it. Each test has a
time budget from the reference's measured time (budgets.py; timer.py stops it), under the hard
cap `test_timeout`. If the process dies in the middle of a test (`os._exit`, a crash), the test it
was running is reported as such and pytest is started again on the tests not yet run, a few times
at most.
"""

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Sequence

from . import settings
from .event_replay import replay
from .protocol import UnitSpec, read_events
from .pytest_process import build, file_of, launch
from .registry import REPO
from .run_results import RunOptions, RunResult, TestResult

# the run's types live in run_results.py; callers take them from here with run_pytest
__all__ = ["RunOptions", "RunResult", "TestResult", "default_jobs", "run_pytest"]

MAX_RESTARTS = 3
MAX_JOBS = 4


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
    # Every test of the collection must have a result: a share whose process died before it
    # reported its collection left its tests unaccounted for, and a verdict on the others alone
    # would read as complete (every exercise passing on the tests that did report).
    reported = {t.test for t in merged.tests}
    silent = [g for s in shares if not s.collected for g in s.general]
    why = "; ".join(silent) or "the test process of its share stopped before reporting it"
    merged.tests += [
        TestResult(t, "error", message=f"not run: {why}") for t in order if t not in reported
    ]
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
    missing = sorted({file_of(f) for f in test_files if not Path(file_of(f)).is_file()})
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
    process = build(units, test_files, options, tmp, attempt, done, result, shard, shared_timeouts)
    returncode, killed, result.output_tail = launch(process, options, time_left)
    return replay(read_events(process.results), returncode, killed, options, done, result)


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)
