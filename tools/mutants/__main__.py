"""`python -m tools.mutants [chNN ...] [--exercise NAME]`: mutation testing of the chapters' tests.

Every exercise's reference is mutated in small, realistic ways (tools/mutants/operators.py lists
the operators) and each mutant is judged as a learner's answer: swapped in alone, the exercise's
tests run until one fails. A mutant is

    killed      a test failed                    timeout   a test ran out of time (killed too)
    survived    every test passed: either the tests miss a mistake, or the mutant is equivalent
    equivalent  listed in the exercise's `equivalent_mutants` in judge/exercises.toml, with the
                reason it computes the same thing (not run)

A survivor is fixed by a new or sharper test, or, if it really is equivalent, by recording it in
the registry. The score of an exercise is killed / (all - equivalent); the target is 95 %.

    python -m tools.mutants ch09                   every exercise of chapter 9, survivors with diffs
    python -m tools.mutants ch09 --exercise evict  one exercise
    python -m tools.mutants --list ch02            the mutants, not run
    python -m tools.mutants --sample 5 --check     CI: 5 mutants per exercise, exit 1 on a survivor
    python -m tools.mutants --markdown             the table of judge/README.md

Exit code: 0 fine; 1 a survivor in --check mode, a stale equivalent, or an exercise under --target;
2 a bad request; 3 the reference fails its own tests.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Dict, List

from rich.console import Console
from rich.table import Table
from rich.text import Text

from judge.registry import REPO, Chapter, Exercise, UnknownChapter, load_registry
from judge.settings import MUTANTS_RESULTS
from judge.stubs import reference_source

from .operators import mutants
from .run import (
    EQUIVALENT,
    INVALID,
    KILLED,
    SURVIVED,
    TIMEOUT,
    Pool,
    ReferenceFails,
    Result,
    judge_mutants,
    reference_durations,
)


def results_dir() -> Path:
    """Where each exercise's last full run is kept (for --markdown), and its last sample's under
    sample/ (for the learner check: tools/workbook/mutant_tryouts.py); tests point it elsewhere."""
    return Path(MUTANTS_RESULTS.read() or REPO / "build" / "mutants")


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.mutants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("chapters", nargs="*", help="chapters (default: all)")
    p.add_argument("--exercise", help="only this exercise (name)")
    p.add_argument("--ids", nargs="+", help="only these mutant ids")
    p.add_argument("--list", action="store_true", help="list the mutants without running them")
    p.add_argument(
        "--sample",
        type=int,
        help="at most this many mutants per exercise, chosen at random (--seed)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check", action="store_true", help="exit 1 if any mutant survives (for CI's sample)"
    )
    p.add_argument(
        "--target",
        type=float,
        default=95.0,
        help="minimum score per exercise, percent (default 95)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print the results table from the last runs (build/mutants/*.json) as Markdown",
    )
    args = p.parse_args(argv)
    console = Console(highlight=False, width=max(Console().width, 120))
    registry = load_registry()
    try:
        chapters = [registry.chapter(c) for c in args.chapters] or list(registry.chapters.values())
        if args.exercise:
            if len(chapters) != 1:
                raise UnknownChapter("--exercise needs exactly one chapter")
            chapters[0].exercise(args.exercise)
    except UnknownChapter as e:
        console.print(f"[bold red]mutants:[/] {e}")
        return 2
    if args.markdown:
        print(markdown(chapters))
        return 0
    plan = _plan(chapters, args)
    if args.list:
        for (chapter, ex), (_, ms) in plan.items():
            for m in ms:
                console.print(Text(f"{ex.id} {m.id}  {m.description}"))
        return 0
    return _run(plan, args, console)


def _plan(chapters: List[Chapter], args) -> Dict:
    plan = {}
    for chapter in chapters:
        for ex in chapter.exercises:
            if args.exercise and ex.name != args.exercise and ex.attr != args.exercise:
                continue
            source = reference_source(chapter.key, ex)
            ms = mutants(source, ex.attr)
            if args.ids:
                ms = [m for m in ms if m.id in args.ids]
            if args.sample is not None:
                equivalent = {mid for mid, _ in ex.equivalent_mutants}
                pool = [m for m in ms if m.id not in equivalent]
                ms = sorted(
                    random.Random(f"{args.seed}:{ex.id}").sample(pool, min(args.sample, len(pool))),
                    key=pool.index,
                )
            if ms:
                plan[(chapter, ex)] = (source, ms)
    return plan


def _run(plan: Dict, args, console: Console) -> int:
    start = time.monotonic()
    chapters = sorted({c for c, _ in plan}, key=lambda c: c.key)
    pool = Pool(chapters, args.device, args.workers)
    total = sum(len(ms) for _, ms in plan.values())
    console.print(
        Text(
            f"mutants: {total} over {len(plan)} exercise(s), {pool.workers} at a time", style="bold"
        )
    )
    code = 0
    rows = []
    durations: Dict[str, Dict[str, float]] = {}
    try:
        for (chapter, ex), (source, ms) in plan.items():
            t0 = time.monotonic()
            try:
                if chapter.key not in durations:
                    durations[chapter.key] = reference_durations(pool, chapter)
                results = judge_mutants(pool, chapter, ex, ms, durations[chapter.key])
            except ReferenceFails as e:
                console.print(f"[bold red]{e}[/]")
                return 3
            row = _summarise(ex, results, time.monotonic() - t0)
            rows.append(row)
            stale = _stale_equivalents(ex, source)
            _print_exercise(console, ex, source, results, row, stale)
            if not args.ids:
                _save(ex, row, results, stale, sample=args.sample is not None)
            if (
                stale
                or (args.check and row["survived"])
                or (args.sample is None and row["score"] < args.target)
            ):
                code = 1
    finally:
        pool.close()
    _print_table(console, rows)
    console.print(Text(f"{total} mutants in {time.monotonic() - start:.0f} s", style="bold"))
    return code


def _summarise(ex: Exercise, results: List[Result], wall: float) -> Dict:
    count = {
        s: sum(r.status == s for r in results)
        for s in (KILLED, TIMEOUT, SURVIVED, INVALID, EQUIVALENT)
    }
    judged = len(results) - count[EQUIVALENT]
    killed = count[KILLED] + count[TIMEOUT] + count[INVALID]
    return {
        "exercise": ex.id,
        "mutants": len(results),
        **count,
        "score": 100.0 * killed / judged if judged else 100.0,
        "wall": round(wall, 1),
    }


def _stale_equivalents(ex: Exercise, source: str) -> List[str]:
    """Equivalents recorded for mutants the reference no longer produces."""
    ids = {m.id for m in mutants(source, ex.attr)}
    return [mid for mid, _ in ex.equivalent_mutants if mid not in ids]


def _print_exercise(
    console: Console, ex: Exercise, source: str, results: List[Result], row: Dict, stale: List[str]
) -> None:
    style = "green" if row["survived"] == 0 else "bold red"
    console.print(
        Text(
            f"{ex.id}: {row['score']:.1f} % killed ({row['killed']} killed, {row['timeout']} "
            "timed out, "
            f"{row['invalid']} invalid, {row['survived']} survived, {row['equivalent']} "
            "equivalent) "
            f"in {row['wall']:.0f} s",
            style=style,
        )
    )
    for r in results:
        if r.status == SURVIVED:
            console.print(Text(f"  survived {r.mutant.id}  {r.mutant.description}", style="red"))
            console.print(Text("    " + r.mutant.diff(source).replace("\n", "\n    "), style="dim"))
    for mid in stale:
        console.print(
            Text(
                f"  stale: {mid} is listed as equivalent but is no longer a mutant of the "
                "reference "
                "(remove it from judge/exercises.toml)",
                style="bold red",
            )
        )


def _print_table(console: Console, rows: List[Dict]) -> None:
    table = Table(header_style="bold")
    table.add_column("exercise", no_wrap=True)
    for col in ("mutants", "killed", "timeout", "survived", "equivalent", "score"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["exercise"],
            str(r["mutants"]),
            str(r["killed"] + r["invalid"]),
            str(r["timeout"]),
            Text(str(r["survived"]), style="bold red" if r["survived"] else ""),
            str(r["equivalent"]),
            f"{r['score']:.1f} %",
        )
    console.print(table)


def _save(
    ex: Exercise, row: Dict, results: List[Result], stale: List[str], sample: bool = False
) -> None:
    folder = results_dir() / "sample" if sample else results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        **row,
        "stale": stale,
        "results": [
            {"id": r.mutant.id, "status": r.status, "by": r.by, "description": r.mutant.description}
            for r in results
        ],
    }
    (folder / f"{ex.id}.json").write_text(json.dumps(data, indent=1))


def markdown(chapters: List[Chapter]) -> str:
    lines = [
        "| exercise | mutants | killed | timed out | survived | equivalent | score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for chapter in chapters:
        for ex in chapter.exercises:
            path = results_dir() / f"{ex.id}.json"
            if not path.is_file():
                lines.append(f"| {ex.id} | not run | | | | | |")
                continue
            r = json.loads(path.read_text())
            lines.append(
                f"| {ex.id} | {r['mutants']} | {r['killed'] + r['invalid']} | {r['timeout']} | "
                f"{r['survived']} | {r['equivalent']} | {r['score']:.1f} % |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
