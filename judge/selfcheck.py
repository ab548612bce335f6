"""`python judge.py --selfcheck [chNN]`: the red/green matrix that proves the judge and the
registry.

For every chapter:
1. the reference passes all the chapter's tests (and every test the registry names exists);
2. each exercise's stub, swapped in alone, fails exactly the tests the registry lists for it, each
   with the stub's NotImplementedError sentinel (not an ImportError, TypeError, ...);
3. each known-wrong variant (judge/variants/chNN_*) still applies exactly to the reference (an edit
   whose lines are gone, or that changes nothing, fails: judge/variant_edits.py), fails at least one
   test and loads cleanly;
4. each stub's signature is the reference's;
5. the chapter's solution notebook (solutions/chNN_*.ipynb), judged from its file as
   `python judge.py chNN --notebook ...` judges a learner's, passes every test: the judge accepts a
   correct saved notebook (the names its cells use resolve in every module they go into).
Runs are independent subprocesses, `workers` at a time.
"""

from __future__ import annotations

import ast
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Sequence, Tuple

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import forkserver
from .budgets import load as load_budgets
from .judging import Verdict, judge
from .registry import Chapter, Exercise, Registry, variant_files
from .runner import RunOptions
from .sources import LearnerCode, from_notebook, from_sources
from .stubs import reference_source, stub_source
from .variant_edits import VariantError, variant_code


@dataclass
class Job:
    chapter: Chapter
    kind: str  # reference | stub | variant | notebook
    name: str  # exercise or variant name ("" for the reference)
    code: LearnerCode | None = None
    exercise: Exercise | None = None


@dataclass
class Outcome:
    job: Job
    ok: bool
    details: List[str] = field(default_factory=list)
    wall: float = 0.0


def selfcheck(
    registry: Registry,
    chapters: Sequence[Chapter],
    console: Console,
    workers: int = 2,
    device: str = "cpu",
) -> int:
    start = time.monotonic()
    jobs, static = _jobs(registry, chapters)
    threads = 1 if workers > 1 else None
    console.print(
        Text(
            f"selfcheck: {len(jobs)} runs over {len(chapters)} chapter(s), {workers} at a time",
            style="bold",
        )
    )
    # One server forks every run (several at once), on a GPU too where its children can use it.
    server = forkserver.server_for(
        device, sorted({e.module for c in chapters for e in c.exercises})
    )

    def run(job: Job) -> Outcome:
        return _run_job(job, device, threads, server, console)

    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            outcomes = static + list(pool.map(run, jobs))
    finally:
        if server is not None:
            server.close()
    _summary(chapters, outcomes, console, time.monotonic() - start)
    return 0 if all(o.ok for o in outcomes) else 1


def _jobs(registry: Registry, chapters: Sequence[Chapter]) -> Tuple[List[Job], List[Outcome]]:
    """The runs to make per chapter (the reference, each exercise's stub, each known-wrong variant,
    each solution notebook), and the outcomes known without a run (a stub that cannot be made)."""
    jobs: List[Job] = []
    static: List[Outcome] = []
    for chapter in chapters:
        jobs.append(Job(chapter, "reference", ""))
        for ex in chapter.exercises:
            try:
                stub = stub_source(chapter.key, ex)
                problem = _signature_mismatch(stub, reference_source(chapter.key, ex))
            except (LookupError, OSError, SyntaxError, ValueError) as e:
                static.append(
                    Outcome(
                        Job(chapter, "stub", ex.name, exercise=ex),
                        False,
                        [f"cannot make the stub: {e}"],
                    )
                )
                continue
            if problem:
                static.append(Outcome(Job(chapter, "stub", ex.name, exercise=ex), False, [problem]))
            code = from_sources(
                chapter, {ex.name: stub}, origin=f"stub {ex.id}", missing="reference"
            )
            jobs.append(Job(chapter, "stub", ex.name, code, ex))
        for path in variant_files(chapter):
            name = path.stem[len(chapter.key) + 1 :]
            try:  # an edit that no longer applies exactly fails here, naming the variant
                jobs.append(Job(chapter, "variant", name, variant_code(path, chapter)))
            except (VariantError, LookupError, OSError) as e:
                static.append(Outcome(Job(chapter, "variant", name), False, [str(e)]))
        for path in solution_notebooks(registry, chapter):
            jobs.append(Job(chapter, "notebook", path.name, from_notebook(path, chapter)))
    return jobs, static


def _run_job(job: Job, device: str, threads: int | None, server, console: Console) -> Outcome:
    """Judge one job's code and evaluate the verdict as its kind expects (EVALUATE)."""
    t0 = time.monotonic()
    options = RunOptions(
        device=device,
        test_timeout=120.0,
        time_limit=900.0,
        threads=threads,
        launcher=server,
        # a variant needs one failing test, not all of them: its run stops at the first (the
        # learner check, tools/workbook, shows what a learner meets for each variant)
        stop_at_first_failure=job.kind == "variant",
        # a correct notebook judged on a busy machine: it is its names that are checked here,
        # not its speed, so no test of it is stopped before 30 s (60 s on a GPU)
        budgets={**load_budgets(), "floor": {"cpu": 30.0, "cuda": 60.0}}
        if job.kind == "notebook"
        else None,
    )
    verdict = judge(
        [job.chapter],
        {job.chapter.key: job.code} if job.code else {},
        options,
        mode=job.kind,
        origin=job.name,
    )
    outcome = EVALUATE[job.kind](job, verdict)
    outcome.wall = time.monotonic() - t0
    mark = Text("ok  ", style="green") if outcome.ok else Text("FAIL", style="bold red")
    console.print(
        mark
        + Text(f" {job.chapter.key} {job.kind} {job.name}".rstrip() + f"  ({outcome.wall:.1f} s)")
    )
    return outcome


# ---------------------------------------------------------------------- evaluating one run


def _reference(job: Job, v: Verdict) -> Outcome:
    out = Outcome(job, True)
    out.details += v.general
    for t in v.tests:
        if not t.ok:
            out.details.append(
                f"the reference fails {t.test} ({t.outcome}): {_first_line(t.message)}"
            )
    ids = [t.test for t in v.tests]
    for ex in job.chapter.exercises:
        for ref in ex.tests:
            if not any(_matches(ref, i) for i in ids):
                out.details.append(
                    f"{ex.id}: the registry lists {ref}, which is not a test of the chapter"
                )
    if not v.tests and not v.general:
        out.details.append("no test ran")
    out.ok = not out.details
    return out


def _stub(job: Job, v: Verdict) -> Outcome:
    ex = job.exercise
    assert ex is not None
    out = Outcome(job, True)
    out.details += v.general
    failing = {t.test: t for t in v.tests if not t.ok}
    # A test skipped on this device (a CPU-only test under --device cuda) judges nothing here.
    expected = {t.test for t in v.tests if ex.judges(t.test) and t.outcome != "skipped"}
    passing = sorted(expected - set(failing))
    if passing:
        out.details.append(
            f"listed for {ex.id} but pass with its stub (drop them from its tests): "
            + ", ".join(_refs(passing))
        )
    unlisted = sorted(set(failing) - expected)
    if unlisted:
        out.details.append(
            f"fail with the stub of {ex.id} but are not in its tests (add them): "
            + ", ".join(f'"{r}"' for r in _refs(unlisted))
        )
    for test, t in sorted(failing.items()):
        if t.sentinel != ex.id:
            out.details.append(
                f"{test} fails with something else than {ex.id}'s NotImplementedError: "
                f"{_first_line(t.message)}"
            )
    problems = [
        e.problem for e in v.exercises if e.problem and "NotImplementedError" not in e.problem
    ]
    out.details += [f"the stub does not load: {p}" for p in problems]
    out.ok = not out.details
    return out


def _variant(job: Job, v: Verdict) -> Outcome:
    """A variant must load and fail a test. What else its run reports (the test process it crashed,
    on a GPU an illegal address from indices read before they arrived) is its own doing, shown but
    not held against the check: the reference's run answers for the judge itself."""
    out = Outcome(job, True)
    problems = [f"{e.id}: {e.problem}" for e in v.exercises if e.problem]
    out.details += [f"the variant does not load: {p}" for p in problems]
    caught = [t.test for t in v.tests if not t.ok]
    if not caught:
        out.details.append("no test catches this variant")
        out.details += v.general
    out.ok = not out.details
    if out.ok:  # the run stopped at the first failing test
        out.details = [f"caught by {_short(caught[0])}"] + [f"(and: {g})" for g in v.general]
    return out


def _notebook(job: Job, v: Verdict) -> Outcome:
    out = Outcome(job, True)
    out.details += v.general
    out.details += [f"{e.id}: {e.problem}" for e in v.exercises if e.problem]
    for t in v.tests:
        if not t.ok:
            out.details.append(
                f"the solution notebook fails {t.test} ({t.outcome}): {_first_line(t.message)}"
            )
    if not v.tests and not v.general:
        out.details.append("no test ran")
    out.ok = not out.details
    return out


def solution_notebooks(registry: Registry, chapter: Chapter) -> List[Path]:
    """solutions/chNN_*.ipynb beside the registry's repository (none for a registry elsewhere)."""
    folder = Path(registry.path).resolve().parent.parent / "solutions"
    return sorted(folder.glob(f"{chapter.key}_*.ipynb")) if folder.is_dir() else []


EVALUATE = {"reference": _reference, "stub": _stub, "variant": _variant, "notebook": _notebook}


def _signature_mismatch(stub: str, reference: str) -> str | None:
    def args(src: str) -> str:
        node = next(
            n for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        )
        return ast.dump(node.args) + ast.dump(node.returns) if node.returns else ast.dump(node.args)

    if args(stub) != args(reference):
        return "the stub's signature differs from the reference's"
    return None


def _matches(ref: str, nodeid: str) -> bool:
    from .registry import test_matches

    return test_matches(ref, nodeid)


def _refs(nodeids: List[str]) -> List[str]:
    """Node ids as registry references, parametrizations folded: 'test_x.py::test_y'."""
    out: List[str] = []
    for n in nodeids:
        path, _, rest = n.partition("::")
        ref = f"{Path(path).name}::{rest.split('[', 1)[0]}"
        if ref not in out:
            out.append(ref)
    return out


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:160] if (text or "").strip() else "(no message)"


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def _summary(
    chapters: Sequence[Chapter], outcomes: List[Outcome], console: Console, wall: float
) -> None:
    table = Table(title="selfcheck", header_style="bold")
    for col in ("chapter", "reference", "stubs", "variants", "notebook", "time"):
        table.add_column(col, justify="left" if col == "chapter" else "right")
    for chapter in chapters:
        mine = [o for o in outcomes if o.job.chapter.key == chapter.key]

        def cell(kind: str) -> Text:
            got = [o for o in mine if o.job.kind == kind]
            if not got:
                return Text("-", style="dim")
            ok = sum(o.ok for o in got)
            return Text(f"{ok}/{len(got)}", style="green" if ok == len(got) else "bold red")

        table.add_row(
            chapter.key,
            cell("reference"),
            cell("stub"),
            cell("variant"),
            cell("notebook"),
            f"{sum(o.wall for o in mine):.0f} s",
        )
    console.print(table)
    for o in outcomes:
        if o.ok and o.job.kind != "variant":
            continue
        head = f"{o.job.chapter.key} {o.job.kind} {o.job.name}".rstrip()
        style = "green" if o.ok else "bold red"
        for d in o.details:
            console.print(Text(f"{'ok' if o.ok else 'FAIL'} {head}: ", style=style) + Text(d))
    bad = sum(not o.ok for o in outcomes)
    console.print(
        Text(
            f"selfcheck {'passed' if not bad else f'FAILED ({bad} of {len(outcomes)} checks)'} "
            f"in {wall:.0f} s",
            style="bold green" if not bad else "bold red",
        )
    )
