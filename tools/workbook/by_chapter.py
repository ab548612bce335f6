"""A command run chapter by chapter in separate processes, `jobs` at a time (`learner --jobs N`).

Each chapter's run is already its own kernel, with its own files (build/students/chNN_*.ipynb), so
chapters share nothing but the machine: one `python -m tools.workbook COMMAND chNN` each, the
longest first (by the run time recorded in its solution notebook) so that the last to finish is a
short one, each chapter's output printed whole when it ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, List

from .paths import REPO
from .source import Chapter


def recorded_seconds(solution: Path) -> float:
    """How long the solution notebook took when it was executed (0 if it does not say)."""
    try:
        meta = json.loads(solution.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return 0.0
    return float(meta.get("minisgl", {}).get("execution", {}).get("seconds") or 0.0)


def run(
    command: str, chapters: List[Chapter], jobs: int, solution_path: Callable[[Chapter], Path]
) -> int:
    """`python -m tools.workbook COMMAND chNN` for each chapter, `jobs` at a time; 1 if any
    failed."""
    order = sorted(chapters, key=lambda c: -recorded_seconds(solution_path(c)))
    lock = threading.Lock()

    def one(ch: Chapter) -> int:
        done = subprocess.run(
            [sys.executable, "-m", "tools.workbook", command, ch.chapter],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        with lock:
            sys.stdout.write(done.stdout)
            if done.returncode != 0:
                print(f"FAIL {ch.stem}: `{command} {ch.chapter}` exited {done.returncode}")
            sys.stdout.flush()
        return done.returncode

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        codes = list(pool.map(one, order))
    return 1 if any(codes) else 0
