"""Showing a verdict: a rich report for people (terminal or notebook), JSON for machines.

Learner-controlled text (messages, code lines) is always printed as plain Text, never as markup.
The reference code is never shown; hints come from the registry, gentlest first.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .hints_report import hinted, render_hints
from .registry import Chapter
from .run_results import TestResult
from .verdicts import (
    ERROR,
    FAILING,
    NO_TESTS,
    NOT_ATTEMPTED,
    PASSING,
    REFERENCE,
    ExerciseVerdict,
    Verdict,
)

STATUS_STYLE = {
    PASSING: ("✔ passing", "green"),
    FAILING: ("✘ failing", "red"),
    NOT_ATTEMPTED: ("· not attempted", "yellow"),
    ERROR: ("! error", "bold red"),
    NO_TESTS: ("– no tests run", "dim"),
    REFERENCE: ("= reference", "dim"),
}
OUTCOME_STYLE = {
    "passed": ("✔", "green"),
    "skipped": ("–", "dim"),
    "failed": ("✘", "red"),
    "error": ("!", "red"),
    "timeout": ("⧗", "magenta"),
    "crashed": ("☠", "bold red"),
}


def render(
    verdict: Verdict,
    chapters: Sequence[Chapter],
    console: Console,
    hint_level: int = 0,
    verbose: bool = False,
    hint_command: str | None = None,
    not_recorded: str | None = None,
) -> None:
    """The report. `hint_command`: how to ask for hints where the learner is (a notebook cell or a
    terminal); `not_recorded`: why this run is not saved as the learner's progress (last line)."""
    console.print(_title(verdict, chapters))
    if verdict.general:
        for g in verdict.general:
            console.print(Text("! ", style="bold red") + Text(g))
    _exercise_table(verdict, console)
    console.print()
    for ex in verdict.exercises:
        _exercise_details(ex, verdict, console, verbose)
    _other_tests(verdict, console, verbose)
    _summary(verdict, console)
    _hint_footer(verdict, chapters, console, hint_level, hint_command)
    if not_recorded:
        console.print(Text(f"not recorded in your progress: {not_recorded}", style="dim"))


def _exercise_table(verdict: Verdict, console: Console) -> None:
    """One row per exercise: its status and its own tests that pass."""
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("exercise")
    table.add_column("status")
    table.add_column("tests", justify="right")
    not_in_file = []
    for ex in verdict.exercises:
        label, style = STATUS_STYLE[ex.status]
        name = ex.id if len(verdict.chapters) > 1 else ex.name
        tests = Text(
            f"{ex.passed_count}/{len(ex.tests)}" if ex.tests else "-",
            style="red" if ex.status in (FAILING, ERROR) else "",
        )
        if ex.alone:
            label += " on its own"
        elif ex.status == REFERENCE and verdict.mode == "learner":
            label, tests = f"{label}: not in your {_kind(verdict)}", Text("-")
            not_in_file.append(name)
        table.add_row(name, Text(label, style=style), tests)
    if verdict.exercises:
        console.print(table)
        console.print(Text(_table_note(verdict, not_in_file), style="dim"))


def _hint_footer(
    verdict: Verdict, chapters, console: Console, hint_level: int, hint_command
) -> None:
    """The hints asked for, else (a learner's run with unfinished exercises) how to ask."""
    key = verdict.chapters[-1]
    if hint_level:
        render_hints(
            hinted(chapters, {e.id: e.status for e in verdict.exercises}),
            console,
            hint_level,
            in_notebook=(hint_command or "").startswith("judge.check"),
        )
    elif (
        verdict.mode == "learner"
        and not verdict.passed
        and any(e.status in (FAILING, NOT_ATTEMPTED) for e in verdict.exercises)
    ):
        command = hint_command or f"python judge.py {key} --hint"
        more = "hint=2" if command.startswith("judge.check") else "--hint 2"
        console.print(
            Text(
                f"Stuck? `{command}` gives a hint for each unfinished exercise ({more} for more).",
                style="dim",
            )
        )


def render_not_started(
    verdict: Verdict,
    chapters: Sequence[Chapter],
    console: Console,
    hint_command: str,
    in_kernel: bool = False,
) -> None:
    """Every exercise still its stub (a fresh clone): what to do next, instead of a wall of red.
    `in_kernel`: judged from the notebook itself (judge.check), whose cells are right above."""
    key = chapters[-1].key
    where = _relative(verdict.origin)
    console.print(Text(f"{chapters[0].key} · {chapters[0].title}", style="bold"))
    console.print(Text(f"judging {where}: every exercise is still its stub", style="dim"))
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("exercise")
    table.add_column("status")
    for ex in verdict.exercises:
        label, style = STATUS_STYLE[ex.status]
        table.add_row(ex.id if len(verdict.chapters) > 1 else ex.name, Text(label, style=style))
    console.print(table)
    console.print()
    console.print(Text("Not attempted yet, so no test was run. Next:", style="bold"))
    if in_kernel:
        console.print(
            "  1. write an exercise in its cell above and run it: the try-out under it shows ✔ "
            "or ✘ at once"
        )
        console.print("  2. run this cell again")
    else:
        console.print(
            f"  1. open {where} (`jupyter lab notebooks/`) and write an exercise in its cell: the "
            "try-out under it shows ✔ or ✘ at once"
        )
        console.print(f"  2. run `python judge.py {key}` again")
    console.print(
        Text(
            f"`python judge.py {key} --solution` shows what green looks like; `{hint_command}` "
            "gives a first hint for each exercise.",
            style="dim",
        )
    )


def _relative(origin: str) -> str:
    """A path under the current directory as written from it (notebooks/ch11_overlap.ipynb)."""
    from pathlib import Path

    try:
        return str(Path(origin).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return origin


def _kind(verdict: Verdict) -> str:
    return (
        "notebook" if verdict.origin.endswith(".ipynb") or "notebook" in verdict.origin else "file"
    )


def _table_note(verdict: Verdict, not_in_file: List[str]) -> str:
    """What the tests column counts: each exercise's own tests, which overlap when a test runs the
    whole engine; so the column need not add up to the run's total, and the note says so."""
    listed = [
        t
        for e in verdict.exercises
        if e.status != REFERENCE or verdict.mode != "learner"
        for t in e.tests
    ]
    shared = len(listed) > len({t.test for t in listed})
    note = f"tests: each exercise's own tests, of the {len(verdict.tests)} in this run"
    if shared:
        note += (
            " (a test that runs the engine judges several exercises, so it counts in each "
            "of their rows)"
        )
    if not_in_file:
        note += (
            f"\nnot in your {_kind(verdict)}, so the reference stayed in place: "
            f"{', '.join(not_in_file)}"
            " (their tests still ran, with your code around them)"
        )
    return note


def _title(verdict: Verdict, chapters: Sequence[Chapter]) -> Text:
    if len(chapters) == 1:
        head = f"{chapters[0].key} · {chapters[0].title}"
    else:
        head = f"{chapters[0].key}–{chapters[-1].key} (cumulative)"
    what = {"learner": f"judging {verdict.origin}", "solution": "the reference solution"}.get(
        verdict.mode, verdict.mode + (f" ({verdict.origin})" if verdict.origin else "")
    )
    t = Text(head, style="bold")
    t.append(f"\n{what} · device {verdict.device} · {verdict.wall:.1f} s", style="dim")
    return t


def _exercise_details(
    ex: ExerciseVerdict, verdict: Verdict, console: Console, verbose: bool
) -> None:
    name = ex.id if len(verdict.chapters) > 1 else ex.name
    if ex.status == ERROR and ex.problem:
        console.print(Text(f"! {name}: ", style="bold red") + Text(ex.problem))
    elif ex.status == NOT_ATTEMPTED:
        failed = len(ex.tests) - ex.passed_count
        console.print(
            Text(f"· {name}: ", style="yellow")
            + Text(
                f"not attempted yet (still the stub): {failed} of its {len(ex.tests)} test(s) "
                "fail until you write it"
                if ex.tests
                else "not attempted yet (still the stub)"
            )
        )
        return
    bad = [t for t in ex.tests if not t.ok and not _stub_failure(t, verdict)]
    stopped = [t for t in ex.tests if not t.ok and _stub_failure(t, verdict)]
    if ex.note and ex.status == PASSING:
        console.print(Text(f"✔ {name}: ", style="green") + Text(ex.note))
    elif ex.note and ex.status == REFERENCE:
        console.print(Text(f"= {name}: ", style="yellow") + Text(ex.note))
    if ex.status in (PASSING, REFERENCE, NO_TESTS) and not verbose:
        return
    if ex.status == FAILING:
        console.print(Text(f"✘ {name}", style="red bold"))
    elif verbose and ex.status != ERROR:
        label, style = STATUS_STYLE[ex.status]
        console.print(Text(f"{label[0]} {name}", style=style + " bold"))
    shown = ex.tests if verbose else bad
    if ex.status == ERROR and not verbose:
        shown = [t for t in bad if not t.standin][:3]  # the stand-in's message is the problem above
    _test_lines(
        [t for t in shown],
        console,
        verbose,
        lambda t: ex.where(t) if ex.status != REFERENCE else None,
    )
    if stopped and ex.status == FAILING and not verbose:
        stubs = sorted({t.sentinel.split(".", 1)[1] for t in stopped})
        console.print(
            Text(
                f"   {len(stopped)} more of its failed test(s) stopped first at "
                f"{', '.join(stubs)}, "
                "still a stub: they judge this exercise once that is written"
            )
        )
    console.print()


def _test_lines(tests: Sequence[TestResult], console: Console, verbose: bool, where) -> None:
    """One line per test; tests not run for one reason (an exercise that already timed out) are
    said once, not once each."""
    not_run: Dict[str, int] = {}
    for t in tests:
        if not verbose and t.outcome == "error" and (t.message or "").startswith("not run: "):
            not_run[t.message] = not_run.get(t.message, 0) + 1
            continue
        _test_line(t, console, indent="   ", where=where(t))
    for message, n in not_run.items():
        console.print(Text("   ! ", style="red") + Text(f"{n} more test(s) {message}"))


def _test_line(t: TestResult, console: Console, indent: str, where: str | None = None) -> None:
    mark, style = OUTCOME_STYLE.get(t.outcome, ("?", ""))
    line = Text(indent) + Text(f"{mark} ", style=style) + Text(_short_id(t.test))
    line.append(f"  {t.outcome}" if t.outcome not in ("passed", "failed") else "", style=style)
    line.append(f"  {t.duration:.2f} s", style="dim")
    console.print(line)
    if t.message and not t.ok:
        for msg_line in t.message.splitlines():
            console.print(Text(indent + "    ") + Text(msg_line))
    if where and not t.ok and not t.sentinel:
        console.print(Text(indent + "    in your code: ", style="cyan") + Text(where))


def _stub_failure(t: TestResult, verdict: Verdict) -> bool:
    """Failed only because an exercise is still its stub (said once, on the exercise's line)."""
    return t.sentinel is not None and any(
        e.id == t.sentinel and e.status == NOT_ATTEMPTED for e in verdict.exercises
    )


def _other_tests(verdict: Verdict, console: Console, verbose: bool) -> None:
    tied = {t.test for e in verdict.exercises for t in e.tests}
    other = [t for t in verdict.tests if t.test not in tied]
    if not other:
        return
    bad = [t for t in other if not t.ok and not _stub_failure(t, verdict)]
    passed = sum(t.ok for t in other)
    console.print(
        Text(
            f"Other tests of the chapter (not tied to one exercise): {passed}/{len(other)} passed",
            style="bold" if bad else "dim",
        )
    )
    _test_lines(other if verbose else bad, console, verbose, lambda t: t.where)
    if bad or verbose:
        console.print()


def _summary(verdict: Verdict, console: Console) -> None:
    c = dict(verdict.counts)
    total = len(verdict.tests)
    passed = c.get("passed", 0)
    parts = [f"{passed}/{total} tests passed"]
    # Tests not run (after a timeout, or once the process had stopped) are errors to pytest, but
    # the lines above say "not run": so does the summary.
    c["not run"] = sum(
        t.outcome == "error" and (t.message or "").startswith("not run: ") for t in verdict.tests
    )
    c["error"] = c.get("error", 0) - c["not run"]
    for outcome in ("failed", "error", "timeout", "crashed", "not run", "skipped"):
        if c.get(outcome):
            parts.append(f"{c[outcome]} {outcome}")
    judged = [e for e in verdict.exercises if e.status not in (REFERENCE, NO_TESTS)]
    if judged:
        ok = sum(e.status == PASSING for e in judged)
        parts.append(f"{ok}/{len(judged)} exercises passing")
    untested = sum(e.status == NO_TESTS for e in verdict.exercises)
    if untested:
        parts.append(f"{untested} exercise(s) without tests run")
    style = "bold green" if verdict.passed else "bold red"
    head = "PASSED" if verdict.passed else "NOT PASSED"
    console.print(
        Text(f"{head}: ", style=style) + Text(", ".join(parts) + f" ({verdict.wall:.1f} s)")
    )


def _short_id(nodeid: str) -> str:
    """'tests/test_ch01_core.py::test_x[a]' -> 'test_ch01_core.py::test_x[a]'."""
    path, sep, rest = nodeid.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest
