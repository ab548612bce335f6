"""Judging mutants: each one is swapped in alone, as a learner's answer would be, and the exercise's
own tests run until the first one fails (pytest -x). Runs fork from a server process that has
already imported torch and the engine (judge/forkserver.py), `workers` at a time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

from judge import forkserver
from judge.judging import judge
from judge.registry import Chapter, Exercise
from judge.runner import RunOptions
from judge.sources import from_sources

from .operators import Mutant

KILLED, TIMEOUT, SURVIVED, INVALID, EQUIVALENT = (
    "killed",
    "timeout",
    "survived",
    "invalid",
    "equivalent",
)


@dataclass
class Result:
    mutant: Mutant
    status: str
    by: str = ""  # the test that killed it, and its message's first line
    wall: float = 0.0


class ReferenceFails(RuntimeError):
    """Mutants cannot be judged: the reference fails the exercise's tests, the registry names a test
    that does not exist, or a run ran no test at all."""


def selectors(chapter: Chapter, ex: Exercise) -> List[str]:
    """The exercise's tests as node ids pytest finds from anywhere."""
    by_name = {f.name: f for f in chapter.test_files}
    out = []
    for ref in ex.tests:
        file, _, rest = ref.partition("::")
        path = by_name.get(Path(file).name)
        if path is not None:
            out.append(f"{path}::{rest}" if rest else str(path))
    return out


class Pool:
    """`workers` runs at a time, forked from one server (subprocesses where it cannot fork)."""

    def __init__(self, chapters: Sequence[Chapter], device: str, workers: int) -> None:
        self.device = device
        self.workers = max(1, workers)
        self.server = forkserver.server_for(
            device, sorted({e.module for c in chapters for e in c.exercises})
        )

    def options(self, test_timeout: float, time_limit: float, stop: bool = True) -> RunOptions:
        return RunOptions(
            device=self.device,
            test_timeout=test_timeout,
            time_limit=time_limit,
            threads=1 if self.workers > 1 else None,
            launcher=self.server,
            stop_at_first_failure=stop,
        )

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def reference_durations(pool: Pool, chapter: Chapter) -> Dict[str, float]:
    """Each test's duration on the reference, which must pass them all (one run per chapter)."""
    verdict = judge([chapter], {}, pool.options(120.0, 900.0, stop=False), mode="reference")
    bad = [t for t in verdict.tests if not t.ok]
    if verdict.general or bad or not verdict.tests:
        why = "; ".join(verdict.general + [f"{t.test}: {t.outcome}" for t in bad]) or "no test ran"
        raise ReferenceFails(f"{chapter.key}: the reference does not pass its tests ({why})")
    return {t.test: t.duration for t in verdict.tests}


def budget(durations: Dict[str, float], ex: Exercise) -> Tuple[float, float]:
    """(per-test timeout, whole-run limit) for a mutant of `ex`: a few times the reference's."""
    mine = [d for test, d in durations.items() if ex.judges(test)] or [1.0]
    return max(10.0, 4 * max(mine)), max(60.0, 3 * sum(mine) + 30)


def judge_mutants(
    pool: Pool,
    chapter: Chapter,
    ex: Exercise,
    mutants: Sequence[Mutant],
    durations: Dict[str, float],
    on_result: Callable[[Result], None] = lambda r: None,
) -> List[Result]:
    missing = [
        ref for ref in ex.tests if not any(ex.judges(t) and _names(ref, t) for t in durations)
    ]
    if missing:  # pytest would refuse the whole run, and every mutant would look like a survivor
        raise ReferenceFails(
            f"{ex.id}: the registry lists tests the chapter does not have: {', '.join(missing)}"
        )
    test_timeout, time_limit = budget(durations, ex)
    tests = selectors(chapter, ex)
    equivalent = {mid for mid, _ in ex.equivalent_mutants}

    def one(mutant: Mutant) -> Result:
        if mutant.id in equivalent:
            result = Result(mutant, EQUIVALENT)
            on_result(result)
            return result
        t0 = time.monotonic()
        code = from_sources(
            chapter, {ex.name: mutant.source}, origin=f"mutant {mutant.id}", missing="reference"
        )
        if code.problems.get(ex.name):
            result = Result(mutant, INVALID, code.problems[ex.name])
        else:
            verdict = judge(
                [chapter],
                {chapter.key: code},
                pool.options(test_timeout, time_limit),
                mode="mutant",
                origin=mutant.id,
                selectors=tests,
            )
            result = _classify(mutant, verdict)
        result.wall = time.monotonic() - t0
        on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=pool.workers) as executor:
        return list(executor.map(one, mutants))


def _names(ref: str, nodeid: str) -> bool:
    from judge.registry import test_matches

    return test_matches(ref, nodeid)


def _classify(mutant: Mutant, verdict) -> Result:
    broken = next(
        (g for g in verdict.general if g.startswith("the tests could not be collected")), None
    )
    if (
        broken
    ):  # the reference's tests collect (reference_durations): the mutant broke a module's import
        return Result(mutant, KILLED, broken.splitlines()[0][:160])
    if not verdict.tests and not any("time limit" in g for g in verdict.general):
        why = "; ".join(g.splitlines()[0] for g in verdict.general) or "no test ran"
        raise ReferenceFails(f"{mutant.id} could not be judged: {why}")
    failed = [t for t in verdict.tests if not t.ok]
    if failed:
        first = failed[0]
        status = TIMEOUT if first.outcome == "timeout" else KILLED
        message = (first.message or first.outcome).strip().splitlines()
        by = first.test.split("::", 1)[-1] + (f": {message[0][:120]}" if message else "")
        return Result(mutant, status, by)
    if verdict.general:
        stopped = any("time limit" in g for g in verdict.general)
        return Result(
            mutant, TIMEOUT if stopped else KILLED, verdict.general[0].splitlines()[0][:160]
        )
    return Result(mutant, SURVIVED)
