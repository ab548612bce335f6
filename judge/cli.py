"""`python judge.py ...`: the command line. See `python judge.py --help` and judge/README.md.

Exit codes: 0 everything passed (for --variant: every variant was caught; for --hint and the
progress table: shown); 1 something failed; 2 the request itself was wrong (unknown chapter, missing
or corrupt notebook or file, bad option); 3 the judge itself broke (set MINISGL_JUDGE_DEBUG=1 for
its traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Sequence

from . import settings
from .cli_args import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    build_parser,
    exercise_selectors,
    normalize_hint,
    notebooks_dir,
    run_options,
)
from .registry import (
    Chapter,
    MissingPackage,
    RegistryError,
    UnknownChapter,
    check_requirements,
    load_registry,
)
from .settings import SettingError

__all__ = ["main", "build_parser", "notebooks_dir"]


# Output that goes to a file or a pipe is not wrapped: rich would otherwise cut at 80 columns, in
# the middle of a test id. COLUMNS still sets a width where someone wants one.
PIPED_WIDTH = 10_000


def _console(stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(stderr=stderr, highlight=False, width=PIPED_WIDTH)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["grade"]:  # the teacher's side: judge/grading/
        from .grading.cli import main as grade

        return grade(argv[1:])
    console = _console()
    err = _console(stderr=True)
    try:
        args = build_parser().parse_args(normalize_hint(argv))
    except SystemExit as e:  # argparse has printed its message
        return EXIT_OK if e.code == 0 else EXIT_USAGE
    debug = False
    try:
        debug = settings.DEBUG.read()  # read first: a bad value is the user's mistake, said as such
        return _main(args, console)
    except (UsageError, UnknownChapter, RegistryError, SettingError, MissingPackage) as e:
        if args.json:
            print(json.dumps({"passed": False, "error": str(e)}))
        else:
            err.print(f"[bold red]judge:[/] {_escape(str(e))}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("judge: interrupted")
        return EXIT_FAILED
    except Exception as e:  # the judge's own bug: say so briefly, never a wall of traceback
        if debug:
            traceback.print_exc()
        err.print(
            f"[bold red]judge: internal error:[/] {_escape(type(e).__name__ + ': ' + str(e))}\n"
            "(this is a bug in the judge, not in your code; MINISGL_JUDGE_DEBUG=1 shows where)"
        )
        return EXIT_INTERNAL


def _main(args: argparse.Namespace, console) -> int:
    from . import progress

    registry = load_registry()
    if args.selfcheck:
        from .selfcheck import selfcheck

        chapters = (
            [registry.chapter(args.chapter)] if args.chapter else list(registry.chapters.values())
        )
        return selfcheck(registry, chapters, console, workers=args.workers, device=args.device)
    if args.chapter is None:
        if (
            args.hint
            or args.hint_level
            or args.file
            or args.notebook
            or args.solution
            or args.variant
        ):
            raise UsageError("name a chapter, e.g. `python judge.py ch03 ...`")
        progress.show(registry, notebooks_dir(), console)
        return EXIT_OK
    chapter = registry.chapter(args.chapter)
    chapters = registry.up_to(chapter.key) if args.cumulative else [chapter]
    hint_level = args.hint_level if args.hint_level is not None else args.hint
    if hint_level:
        if args.exercise:
            chapter.exercise(args.exercise)  # an unknown name is a usage error
        from .cli_hints import show_hints

        return show_hints(chapters, chapter, hint_level, args, console)
    check_requirements(chapters)  # before reading the learner's code: the fix is an install
    if args.variant:
        from .cli_variants import run_variants

        return run_variants(chapter, chapters, args, console)
    return _judge_and_report(chapter, chapters, args, console)


def _judge_and_report(chapter: Chapter, chapters, args: argparse.Namespace, console) -> int:
    """Judge the reference (--solution) or the learner's code, record it as progress where it is
    the chapter's notebook, and print the verdict."""
    from . import progress, report, report_json
    from .judging import judge

    options = run_options(args)
    selectors = exercise_selectors(chapter, args.exercise) if args.exercise else None

    not_recorded = None
    if args.solution:
        verdict = judge(
            chapters, {}, options, mode="solution", origin="minisgl", selectors=selectors
        )
    else:
        codes = {c.key: _learner_code(c, args, is_target=(c.key == chapter.key)) for c in chapters}
        origin = ", ".join(sorted({codes[c.key].origin for c in chapters}, key=str))
        if _untouched(codes, chapters) and not args.exercise and not options.keyword:
            return _not_started(chapters, codes, options, origin, args, console, chapter)
        if _nothing_can_run(codes, chapters):
            verdict = _static_verdict(chapters, codes, options, origin)
        else:
            verdict = judge(
                chapters, codes, options, mode="learner", origin=origin, selectors=selectors
            )
        not_recorded = _not_recorded(chapter, args, options)
        if not_recorded is None:
            progress.record(verdict, chapters, codes)
    if args.json:
        print(
            json.dumps(
                report_json.to_json(
                    verdict, chapters, not_recorded=None if args.solution else not_recorded
                ),
                indent=1,
            )
        )
    else:
        report.render(
            verdict,
            chapters,
            console,
            verbose=args.verbose,
            hint_command=_hint_command(chapter, args),
            not_recorded=None if args.solution else not_recorded,
        )
    return EXIT_OK if verdict.passed else EXIT_FAILED


def _not_recorded(chapter: Chapter, args: argparse.Namespace, options) -> str | None:
    """Why this learner run is not saved as progress (None: it is). The progress record is the
    standing of the chapter's notebook: a file, another notebook or part of the chapter is only
    shown."""
    if args.file is not None:
        return "judged a file"
    if args.notebook is not None and not _is_chapter_notebook(chapter, args.notebook):
        return f"judged another notebook than {notebooks_dir().name}/{chapter.key}_*.ipynb"
    if args.exercise or options.keyword:
        return "judged part of the chapter (--exercise / -k)"
    return None


def _is_chapter_notebook(chapter: Chapter, path: Path) -> bool:
    from .sources import SourceError, find_notebook

    try:
        return find_notebook(chapter, notebooks_dir()).resolve() == Path(path).resolve()
    except (SourceError, OSError):
        return False


def _hint_command(chapter: Chapter, args: argparse.Namespace) -> str:
    """How to ask for hints about what was just judged."""
    source = (
        f" --file {args.file}"
        if args.file is not None
        else f" --notebook {args.notebook}"
        if args.notebook is not None
        else ""
    )
    return (
        f"python judge.py {chapter.key}{source}{' --cumulative' if args.cumulative else ''} --hint"
    )


def _learner_code(chapter: Chapter, args: argparse.Namespace, is_target: bool):
    from .sources import SourceError, find_notebook, from_file, from_notebook, require_some_exercise

    try:
        if is_target and args.file is not None:
            # A file may hold only the functions being worked on: the others stay the reference.
            code = from_file(args.file, chapter, missing="reference")
            require_some_exercise(code, chapter, args.file)
            return code
        if is_target and args.notebook is not None:
            return from_notebook(args.notebook, chapter)
        return from_notebook(find_notebook(chapter, notebooks_dir()), chapter)
    except SourceError as e:
        raise UsageError(str(e)) from None


def _nothing_can_run(codes, chapters: Sequence[Chapter]) -> bool:
    """Every exercise already has a problem (e.g. the file does not parse): running tests is
    pointless."""
    exercises = [(c, e) for c in chapters for e in c.exercises]
    return bool(exercises) and all(e.name in codes[c.key].problems for c, e in exercises)


def _untouched(codes, chapters: Sequence[Chapter]) -> bool:
    """Every exercise is still its stub, as in a fresh clone: nothing of the learner's to judge."""
    return any(c.exercises for c in chapters) and all(codes[c.key].untouched(c) for c in chapters)


def _not_started(chapters, codes, options, origin: str, args, console, target) -> int:
    """An untouched notebook is not failing code: exit 0, and say what to do next. No test is run
    (each would only meet a stub's NotImplementedError); the progress table keeps its row."""
    from . import report, report_json
    from .judging import not_attempted

    verdict = not_attempted(chapters, origin, options.device)
    if _not_recorded(target, args, options) is None:
        from . import progress

        progress.record(verdict, chapters, codes)
    if args.json:
        print(json.dumps({**report_json.to_json(verdict, chapters), "not_started": True}, indent=1))
    else:
        report.render_not_started(verdict, chapters, console, _hint_command(chapters[-1], args))
    return EXIT_OK


def _static_verdict(chapters, codes, options, origin: str):
    from .verdicts import ERROR, ExerciseVerdict, Verdict

    exercises = [
        ExerciseVerdict(c.key, e.name, e.target, ERROR, problem=codes[c.key].problems[e.name])
        for c in chapters
        for e in c.exercises
    ]
    general = [g for c in chapters for g in codes[c.key].general_problems]
    general.append("no test was run: fix the problems above first")
    return Verdict(
        [c.key for c in chapters], "learner", origin, options.device, exercises, [], general, 0.0
    )


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
