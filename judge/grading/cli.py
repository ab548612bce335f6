"""`python judge.py grade CHAPTER... SUBMISSION...`: judge a class's notebooks (see the README's
"Grading a class" section)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import export, report
from .discover import CHAPTER, SubmissionError, discover
from .isolate import Limits, probe
from .points import load as load_points
from .run import JUDGED, Cache, fingerprint, grade

EXIT_OK, EXIT_USAGE, EXIT_TAMPERED = 0, 2, 3
TAMPERED = (
    "the judge's checkout (its code, tests or engine) changed while grading: a submission wrote "
    "into it, so no verdict can be trusted; restore it (git checkout, git status) and grade in "
    "the container (Dockerfile)"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="judge.py grade",
        description="Judge every submitted notebook, each in a sandbox of its own, and write the "
        "grade book (CSV, JSON, HTML), Gradescope results and JUnit XML.",
    )
    p.add_argument(
        "items",
        nargs="+",
        metavar="CHAPTER|SUBMISSION",
        help="chapters (ch01 ...), then notebooks or folders of them (one per student)",
    )
    p.add_argument(
        "--out", type=Path, default=Path("grades"), help="where the reports go (default: grades/)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
        help="submissions judged at once (default: the cores)",
    )
    p.add_argument(
        "--points", type=Path, help="points per exercise (default: judge/grading/points.toml)"
    )
    p.add_argument("--no-cache", action="store_true", help="judge every submission again")
    d = Limits()
    p.add_argument("--memory-mb", type=int, default=d.memory_mb, help="address space per process")
    p.add_argument("--cpu-s", type=int, default=d.cpu_s, help="CPU seconds per process")
    p.add_argument("--wall-s", type=float, default=d.wall_s, help="seconds per submission")
    p.add_argument(
        "--file-mb", type=int, default=d.file_mb, help="largest file a submission may write"
    )
    p.add_argument(
        "--processes", type=int, default=d.processes, help="processes and threads per submission"
    )
    p.add_argument("--scratch-mb", type=int, default=d.scratch_mb, help="size of its private /tmp")
    return p


@dataclass
class _Request:
    """What the command line asks: the submissions found, and how to grade them."""

    args: argparse.Namespace
    roots: List[Path]
    limits: Limits
    points: Any
    submissions: list
    skipped: List[str]


def _read_request(argv: Sequence[str]) -> _Request:
    """The command line read and checked (a SubmissionError, ValueError or KeyError names what is
    wrong; argparse exits on its own errors)."""
    args = build_parser().parse_args(list(argv))
    chapters: List[str] = []
    roots: List[Path] = []
    for item in args.items:
        (chapters if CHAPTER.match(item) and not roots else roots).append(item)
    from ..registry import load_registry

    registry = load_registry()
    for chapter in chapters:
        registry.chapter(chapter)  # an unknown chapter is named here, not per submission
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    limits = Limits(
        args.memory_mb, args.cpu_s, args.wall_s, args.file_mb, args.processes, args.scratch_mb
    )
    points = load_points(args.points)
    submissions, skipped = discover(chapters, [Path(r) for r in roots])
    return _Request(args, [Path(r) for r in roots], limits, points, submissions, skipped)


def _grade_with_progress(req: _Request, containment, hidden, cache, err: Console):
    with Progress(
        TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err,
    ) as bar:  # fmt: skip
        task = bar.add_task("", total=len(req.submissions))

        def done(v):
            bar.update(
                task,
                advance=1,
                description=f"{v.student} {v.chapter}: {v.outcome}"
                + (" (cached)" if v.cached else ""),
            )

        return grade(req.submissions, containment, req.limits, hidden, cache, req.args.jobs, done)


def _write_reports(out: Path, verdicts, points, lines: List[str], err: Console) -> None:
    report.write_csv(out / "grades.csv", verdicts, points)
    report.write_json(out / "grades.json", verdicts, points, lines)
    report.write_html(out / "report.html", verdicts, points, lines)
    export.write_gradescope(out / "gradescope", verdicts, points)
    export.write_junit(out / "junit.xml", verdicts, points)
    judged = sum(v.outcome == JUDGED for v in verdicts)
    cached = sum(v.cached for v in verdicts)
    err.print(
        f"{len(verdicts)} submissions: {judged} judged, {len(verdicts) - judged} without a verdict "
        f"(named in the report); {cached} from the cache"
    )
    for v in verdicts:
        if v.outcome != JUDGED:
            err.print(f"  {v.student} {v.chapter}: {v.outcome}: {v.reason}")
    err.print(f"written: {out}/grades.csv, grades.json, report.html, junit.xml, gradescope/")


def main(argv: Sequence[str]) -> int:
    err = Console(stderr=True, highlight=False)
    try:
        req = _read_request(argv)
    except SystemExit as e:  # argparse has printed its message
        return EXIT_OK if e.code == 0 else EXIT_USAGE
    except (SubmissionError, ValueError, KeyError) as e:
        err.print(f"[bold red]judge grade:[/] {e}")
        return EXIT_USAGE
    out: Path = req.args.out
    out.mkdir(parents=True, exist_ok=True)
    for line in req.skipped:
        err.print(f"[yellow]left out:[/] {line}")
    containment = probe()
    hidden = sorted(
        {(r if r.is_dir() else r.parent).resolve() for r in req.roots} | {out.resolve()}
    )
    judge_before = fingerprint()
    cache = None if req.args.no_cache else Cache(out / "cache.json", f"{judge_before}|{req.limits}")
    try:
        verdicts = _grade_with_progress(req, containment, hidden, cache, err)
    except ValueError as e:
        err.print(f"[bold red]judge grade:[/] {e}")
        return EXIT_USAGE
    lines = containment.describe()
    tampered = fingerprint() != judge_before
    if tampered:  # possible only where the checkout is writable to the submissions (no namespaces)
        lines.append(TAMPERED)
    _write_reports(out, verdicts, req.points, lines, err)
    if tampered:
        err.print(f"[bold red]judge grade:[/] {TAMPERED}")
        return EXIT_TAMPERED
    return EXIT_OK
