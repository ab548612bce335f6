"""Judging a class: every submission in its own sandbox, several at a time, with a cache.

Each submission's verdict is the judge's own (`judge.py chNN --notebook F --json`, run in
`isolate.Sandbox`), or, when that process gives none, why: it timed out, or it died (a crash, a
killed judge). Whatever one submission does costs only its own verdict. A verdict is kept in the
cache under the notebook's SHA-256, the chapter, the judge's fingerprint (its code, tests and the
reference engine) and the limits, so grading again judges only what changed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..child_process import SUPERVISOR_LOST
from ..registry import load_registry
from .discover import Submission
from .isolate import REPO, Containment, Limits, Outcome, Sandbox

JUDGED, REJECTED, CRASHED, TIMED_OUT = "judged", "rejected", "crashed", "timed out"
NOT_JUDGED = "not judged"  # an exercise's status when its submission gave no verdict
PASSING = "passing"
LOST = SUPERVISOR_LOST  # the judge's words for a test process whose parent, its fork server, died


@dataclass
class ExerciseResult:
    id: str
    name: str
    status: str  # the judge's: passing, failing, not attempted, error, timeout...; or NOT_JUDGED
    passed: int
    total: int
    failures: List[str] = field(default_factory=list)  # the lines the learner would have seen


@dataclass
class Verdict:
    student: str
    chapter: str
    notebook: str
    sha256: str
    outcome: str  # JUDGED, REJECTED, CRASHED, TIMED_OUT
    reason: Optional[str]
    exercises: List[ExerciseResult]
    general: List[str]
    wall_s: float
    cached: bool = False

    @property
    def key(self) -> str:
        return f"{self.student}/{self.chapter}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        data = dict(data)
        data["exercises"] = [ExerciseResult(**e) for e in data["exercises"]]
        return cls(**data)


def fingerprint() -> str:
    """What a verdict depends on besides the notebook: the judge (this package's reading of its
    output included), the tests, the engine."""
    h = hashlib.sha256()
    for folder in ("judge", "tests", "minisgl"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix in (".py", ".toml", ".json") and path.name != "points.toml":
                h.update(str(path.relative_to(REPO)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _exercise_ids(chapter: str) -> List[tuple]:
    return [(e.id, e.name) for e in load_registry().chapter(chapter).exercises]


def interpret(sub: Submission, outcome: Outcome) -> Verdict:
    """The verdict from what the sandboxed judge left behind."""

    def without(outcome_name: str, reason: str) -> Verdict:
        exercises = [ExerciseResult(i, n, NOT_JUDGED, 0, 0) for i, n in _exercise_ids(sub.chapter)]
        return Verdict(
            sub.student, sub.chapter, str(sub.path), sub.sha256, outcome_name, reason,
            exercises, [], round(outcome.wall_s, 2),
        )  # fmt: skip

    if outcome.at_process_limit:
        return without(
            CRASHED,
            f"stopped at the process limit, {outcome.process_limit} processes and threads "
            "(--processes): it kept starting processes (a fork bomb?)",
        )
    if outcome.timed_out:
        limit = f"{outcome.wall_limit_s:g} s"
        return without(TIMED_OUT, f"no verdict within the wall-time limit, {limit} (--wall-s)")
    data = _last_json(outcome.stdout)
    if data is not None and "error" in data and "exercises" not in data:
        return without(REJECTED, data["error"])
    if data is None or "exercises" not in data:
        return without(CRASHED, _death(outcome))
    tests = {t["test"]: t for t in data.get("tests", [])}
    exercises = _exercise_results(data, tests)
    general = [g if isinstance(g, str) else json.dumps(g) for g in data.get("general", [])]
    reason = _why_the_run_is_void(data, tests, general)
    return Verdict(
        sub.student, sub.chapter, str(sub.path), sub.sha256, CRASHED if reason else JUDGED,
        reason, exercises, general, round(outcome.wall_s, 2),
    )  # fmt: skip


def _exercise_results(data: dict, tests: Dict[str, dict]) -> List[ExerciseResult]:
    """Each exercise's status and counts, with the messages of its failed tests."""
    exercises = []
    for ex in data["exercises"]:
        failures = [ex["problem"]] if ex.get("problem") else []
        for test_id in ex.get("tests", []) if ex["status"] != PASSING else []:
            # (a passing exercise's shared test may fail for another exercise: not its line)
            t = tests.get(test_id)
            if t and t["outcome"] != "passed" and t.get("message"):
                failures.append(f"{test_id.split('::')[-1]}: {t['message']}")
        exercises.append(
            ExerciseResult(ex["id"], ex["name"], ex["status"], ex["passed"], ex["total"], failures)
        )
    return exercises


def _why_the_run_is_void(data: dict, tests: Dict[str, dict], general: List[str]) -> str | None:
    """Why no exercise's status of this run can be trusted (the verdict is CRASHED), or None."""
    counts = data.get("counts", {})
    # The fork server that reports a test process's end was killed, and only the tests and the
    # submission's code run in its test processes. The judge voids every pass of a process it
    # lost so (no exercise passes on them), but cannot tell whose test did it: the shares run
    # at once, and each loses its process then.
    lost = [t["test"] for t in tests.values() if LOST in (t.get("message") or "")]
    if lost:
        during = [t for t in lost if tests[t]["message"].endswith("during this test")] or lost
        return (
            "the judge's fork server was killed by the submission's code while its test "
            f"processes ran (one in {during[0].split('::')[-1]}): their results are void"
        )
    if general and not data.get("passed") and (counts.get("crashed") or counts.get("error")):
        # Tests did not run and the judge names no exercise but the run itself ("the test process
        # ended abruptly"): the learner's code ended it from outside any test's reach (killed the
        # judge's fork server, say). Then no exercise's status can be trusted, "passing" or not.
        # (A crash inside a test is the exercise's: the judge blames it, and says nothing here.)
        return "the judge's run did not finish: " + "; ".join(general or ["a test process died"])
    return None


def _last_json(stdout: str) -> Optional[dict]:
    try:
        data = json.loads(stdout)
        return data if isinstance(data, dict) else None
    except ValueError:
        return None


def _death(outcome: Outcome) -> str:
    code = outcome.returncode
    # The sandbox's shell, the judge's parent, exits 128 + N when the judge died of signal N.
    number = -code if code is not None and code < 0 else (code or 0) - 128
    if 0 < number < signal.NSIG:
        try:
            how = f"killed by {signal.Signals(number).name}"
        except ValueError:
            how = f"killed by signal {number}"
    else:
        how = f"exit status {code}"
    last = [line for line in outcome.stderr.strip().splitlines() if line.strip()]
    return f"the judge died without a verdict ({how})" + (f": {last[-1][:300]}" if last else "")


class Cache:
    """Verdicts by (notebook hash, chapter, judge fingerprint, limits), in one JSON file."""

    def __init__(self, path: Path, salt: str):
        self.path, self.salt = path, salt
        try:
            self.entries: Dict[str, dict] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def _key(self, sub: Submission) -> str:
        return hashlib.sha256(f"{sub.sha256}|{sub.chapter}|{self.salt}".encode()).hexdigest()

    def get(self, sub: Submission) -> Optional[Verdict]:
        entry = self.entries.get(self._key(sub))
        if entry is None:
            return None
        verdict = Verdict.from_json(entry)
        verdict.student, verdict.notebook, verdict.cached = sub.student, str(sub.path), True
        return verdict

    def put(self, sub: Submission, verdict: Verdict) -> None:
        self.entries[self._key(sub)] = {**verdict.to_json(), "cached": False}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)


def grade(
    submissions: Sequence[Submission],
    containment: Containment,
    limits: Limits,
    hidden: Sequence[Path],
    cache: Optional[Cache],
    jobs: int,
    on_done: Callable[[Verdict], None] = lambda v: None,
) -> List[Verdict]:
    """Every submission's verdict, in the order given; `on_done` hears of each as it comes."""
    sandbox = Sandbox(containment, limits, hidden)
    verdicts: Dict[str, Verdict] = {}
    todo = []
    for sub in submissions:
        hit = cache.get(sub) if cache else None
        if hit:
            verdicts[sub.key] = hit
            on_done(hit)
        else:
            todo.append(sub)
    with tempfile.TemporaryDirectory(prefix="minisgl-grade-") as work:

        def judge_one(i: int, sub: Submission) -> Verdict:
            outcome = sandbox.run(sub.chapter, sub.path.read_bytes(), Path(work) / str(i), str(i))
            return interpret(sub, outcome)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(judge_one, i, sub): sub for i, sub in enumerate(todo)}
            for future in concurrent.futures.as_completed(futures):
                sub = futures[future]
                verdict = future.result()
                verdicts[sub.key] = verdict
                if cache:
                    cache.put(sub, verdict)
                    cache.save()
                on_done(verdict)
    return [verdicts[sub.key] for sub in submissions]
