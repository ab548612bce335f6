"""The learner's progress: one small JSON file in the checkout (`.judge_progress.json`,
git-ignored), updated after each complete judged run of the learner's notebook (`python judge.py
chNN`, or `judge.check` in the notebook), and the table `python judge.py` prints. A `--file` run is
only shown:
the record is the notebook's standing."""

from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Dict, Sequence, Set

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import settings
from .registry import REPO, Chapter, Registry
from .sources import LearnerCode, SourceError, find_notebook, from_notebook
from .verdicts import NO_TESTS, NOT_ATTEMPTED, PASSING, Verdict

PROGRESS_ENV = settings.PROGRESS.name  # tests point this elsewhere


def progress_path() -> Path:
    return Path(settings.PROGRESS.read() or REPO / ".judge_progress.json")


def load() -> Dict:
    try:
        data = json.loads(progress_path().read_text(encoding="utf-8"))
        return (
            data
            if isinstance(data, dict) and isinstance(data.get("chapters"), dict)
            else {"chapters": {}}
        )
    except (OSError, ValueError):
        return {"chapters": {}}  # missing or damaged: start afresh rather than fail


def record(
    verdict: Verdict, chapters: Sequence[Chapter], codes: Dict[str, LearnerCode] | None = None
) -> None:
    """Remember the outcome of judging the learner's notebook (saved, or live in the kernel), per
    chapter and exercise, with a fingerprint of each exercise's code (see `fingerprints`). Only the
    notebook's runs come here: a `--file` run is shown, not recorded (cli.py)."""
    if verdict.mode != "learner":
        return
    data = load()
    now = _dt.datetime.now().isoformat(timespec="seconds")
    for chapter in chapters:
        key = chapter.key
        tests = verdict.tests_of(chapter)
        code = (codes or {}).get(key)
        data["chapters"][key] = {
            "last_run": now,
            "source": verdict.origin,
            "exercises": {e.name: e.status for e in verdict.exercises if e.chapter == key},
            "fingerprints": fingerprints(code, chapter) if code is not None else {},
            # as the run's summary line counts them: a skipped test is not a passed one
            "tests_passed": sum(t.outcome == "passed" for t in tests),
            "tests_skipped": sum(t.outcome == "skipped" for t in tests),
            "tests_total": len(tests),
            "passed": verdict.passed_in(chapter),
        }
    path = progress_path()
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a read-only checkout still gets its report


def fingerprints(code: LearnerCode, chapter: Chapter) -> Dict[str, str]:
    """{exercise name: a hash of its `def`} (the syntax tree, so the saved cell and the same
    function
    read live from the kernel agree): tells whether an exercise changed since it was judged."""
    defined = code.defined()
    out = {}
    for ex in chapter.exercises:
        node = defined.get(ex.attr)
        if node is not None:
            out[ex.name] = hashlib.sha1(ast.dump(node).encode()).hexdigest()[:16]
    return out


def passing_now(chapter: Chapter, code: LearnerCode) -> Set[str]:
    """The exercises of `code` (the notebook as it is now) that passed at the notebook's last
    recorded run and have not changed since: no hints are needed for them."""
    entry = load()["chapters"].get(chapter.key) or {}
    status, prints = entry.get("exercises", {}), entry.get("fingerprints")
    now = fingerprints(code, chapter)
    return {
        name
        for name, st in status.items()
        if st in (PASSING, NO_TESTS)
        and code.attempted.get(name)
        and (prints is None or (name in now and prints.get(name) == now[name]))
    }


def show(registry: Registry, notebooks_dir: Path, console: Console) -> None:
    data = load()["chapters"]
    table = Table(
        title="minisgl workbook: progress",
        title_style="bold",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("chapter", no_wrap=True, min_width=7)
    table.add_column("title", no_wrap=True, overflow="ellipsis", max_width=28)
    for col in ("tried", "passing"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    table.add_column("last run", no_wrap=True, min_width=11)
    table.add_column("tests", justify="right", no_wrap=True, min_width=7)
    for chapter in registry.chapters.values():
        n = len(chapter.exercises)
        attempted = "-"
        try:
            code = from_notebook(find_notebook(chapter, notebooks_dir), chapter)
            attempted = f"{sum(code.attempted.values())}/{n}"
        except SourceError:
            pass  # no notebook yet
        entry = data.get(chapter.key)
        statuses = (entry or {}).get("exercises", {}).values()
        if entry and statuses and all(s == NOT_ATTEMPTED for s in statuses):
            # judged while every exercise was its stub: no test ran, so no "0/4 passing" with a
            # date, as if four answers had failed
            passing, last, tests = Text("-"), "stubs only", "-"
        elif entry:
            ok = sum(s in (PASSING, NO_TESTS) for s in entry.get("exercises", {}).values())
            passing = Text(
                f"{ok}/{n}", style="green" if entry.get("passed") else "yellow" if ok else "red"
            )
            last = str(entry.get("last_run", "?")).replace("T", " ")[5:16]
            tests = f"{entry.get('tests_passed', 0)}/{entry.get('tests_total', 0)}"
            if entry.get("tests_skipped"):
                tests += f" ({entry['tests_skipped']} skipped)"
        else:
            passing, last, tests = Text("-"), "never", "-"
        table.add_row(chapter.key, chapter.title, attempted, passing, last, tests)
    console.print(table)
    console.print(
        Text(
            "tried: exercises no longer a stub in the saved notebook; passing: at its last "
            "judged run\n"
            "(python judge.py chNN, or judge.check in the notebook; --file runs are not "
            "recorded).\n"
            "Judge a chapter: python judge.py ch03   ·   all options: python judge.py --help",
            style="dim",
        )
    )
