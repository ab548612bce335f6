"""The learner's progress: one small JSON file in the checkout (`.judge_progress.json`, git-ignored),
updated after each judged run of the learner's own code, and the table `python judge.py` prints."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Dict, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .judging import NO_TESTS, PASSING, Verdict
from .registry import REPO, Chapter, Registry
from .sources import SourceError, find_notebook, from_notebook

PROGRESS_ENV = "MINISGL_JUDGE_PROGRESS"  # tests point this elsewhere


def progress_path() -> Path:
    return Path(os.environ.get(PROGRESS_ENV) or REPO / ".judge_progress.json")


def load() -> Dict:
    try:
        data = json.loads(progress_path().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) and isinstance(data.get("chapters"), dict) else {"chapters": {}}
    except (OSError, ValueError):
        return {"chapters": {}}  # missing or damaged: start afresh rather than fail


def record(verdict: Verdict, chapters: Sequence[Chapter]) -> None:
    """Remember the outcome of judging the learner's code, per chapter and exercise."""
    if verdict.mode != "learner":
        return
    data = load()
    now = _dt.datetime.now().isoformat(timespec="seconds")
    for chapter in chapters:
        key = chapter.key
        tests = verdict.tests_of(chapter)
        data["chapters"][key] = {
            "last_run": now,
            "source": verdict.origin,
            "exercises": {e.name: e.status for e in verdict.exercises if e.chapter == key},
            "tests_passed": sum(t.ok for t in tests),
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


def show(registry: Registry, notebooks_dir: Path, console: Console) -> None:
    data = load()["chapters"]
    table = Table(title="minisgl workbook: progress", title_style="bold", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
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
        if entry:
            ok = sum(s in (PASSING, NO_TESTS) for s in entry.get("exercises", {}).values())
            passing = Text(f"{ok}/{n}", style="green" if entry.get("passed") else "yellow" if ok else "red")
            last = str(entry.get("last_run", "?")).replace("T", " ")[5:16]
            tests = f"{entry.get('tests_passed', 0)}/{entry.get('tests_total', 0)}"
        else:
            passing, last, tests = Text("-"), "never", "-"
        table.add_row(chapter.key, chapter.title, attempted, passing, last, tests)
    console.print(table)
    console.print(Text("tried: exercises no longer a stub in the saved notebook; passing: at the last run.\n"
                       "Judge a chapter: python judge.py ch03   ·   all options: python judge.py --help",
                       style="dim"))
