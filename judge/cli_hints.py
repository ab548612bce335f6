"""`python judge.py chNN --hint`: the hints for what is unfinished in the source being judged
(hints never run the tests)."""

from __future__ import annotations

import argparse
import json
from typing import List, Sequence

from .cli_args import EXIT_OK, UsageError, notebooks_dir
from .registry import Chapter


def show_hints(
    chapters: Sequence[Chapter], chapter: Chapter, level: int, args: argparse.Namespace, console
) -> int:
    """Hints for what is unfinished in the source being judged now (hints never run the tests): with
    --file, the exercises the file defines (a file's runs are not recorded, so each may still be
    wrong); else the notebook's exercises, read as saved, less those that passed at its last
    recorded
    run and have not changed since."""
    from . import hints_report, progress
    from .sources import SourceError, find_notebook, from_file, from_notebook, require_some_exercise

    unfinished: List[str] = []
    for c in chapters:
        try:
            if c.key == chapter.key and args.file is not None:
                code = from_file(args.file, c, missing="reference")
                require_some_exercise(code, c, args.file)
                unfinished += [e.id for e in c.exercises if code.swaps(e.name)]
                continue
            path = (
                args.notebook
                if c.key == chapter.key and args.notebook is not None
                else find_notebook(c, notebooks_dir())
            )
            code = from_notebook(path, c)
        except SourceError as e:
            if args.file is not None or args.notebook is not None:
                raise UsageError(str(e)) from None
            unfinished += [e.id for e in c.exercises]  # no notebook to read: every exercise
            continue
        done = progress.passing_now(c, code)
        unfinished += [e.id for e in c.exercises if e.name not in done]
    status = {ex.id: "passing" for c in chapters for ex in c.exercises if ex.id not in unfinished}
    exercises = hints_report.hinted(chapters, status, only=args.exercise)
    if args.json:
        print(json.dumps({"hints": {e.id: list(e.hints[:level]) for e in exercises}}, indent=1))
    else:
        hints_report.render_hints(exercises, console, level)
    return EXIT_OK
