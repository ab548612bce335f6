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
import re
import sys
import traceback
from pathlib import Path
from typing import List, Sequence

from . import settings
from .registry import (
    REPO,
    Chapter,
    MissingPackage,
    RegistryError,
    UnknownChapter,
    check_requirements,
    load_registry,
    variant_files,
)
from .settings import SettingError

NOTEBOOKS_ENV = settings.NOTEBOOKS.name
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


class UsageError(Exception):
    pass


def notebooks_dir() -> Path:
    return Path(settings.NOTEBOOKS.read() or REPO / "notebooks")


def _chapter_range() -> str:
    """'ch00 .. ch15': the registry's chapters, so that --help stays true as chapters are added."""
    try:
        keys = list(load_registry().chapters)
    except (RegistryError, SettingError, OSError):
        return "chNN"
    return f"{keys[0]} .. {keys[-1]}" if keys else "chNN"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python judge.py",
        description="Judge your exercises: swap your functions into the reference engine and "
        "run the "
        "chapter's tests. With no chapter: show your progress.",
        epilog="examples:  python judge.py ch03 | python judge.py ch11 --device cuda | "
        "python judge.py ch09 --hint | python judge.py ch11 --variant upstream | "
        "python judge.py --selfcheck ch09",
    )
    p.add_argument("chapter", nargs="?", help=f"a chapter: {_chapter_range()} (or just 11)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--file", type=Path, help="judge this Python file (top-level defs named like the targets)"
    )
    src.add_argument(
        "--notebook", type=Path, help="judge this notebook instead of notebooks/chNN_*.ipynb"
    )
    src.add_argument(
        "--solution", action="store_true", help="run the tests on the reference engine"
    )
    src.add_argument(
        "--variant",
        metavar="NAME",
        help="run a known-wrong variant (judge/variants/chNN_NAME*.py) "
        "and show which tests catch it; 'list' lists them",
    )
    p.add_argument(
        "--cumulative",
        action="store_true",
        help="swap in your exercises of every chapter up to this one and run all their tests",
    )
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu", help="default: cpu")
    p.add_argument("--exercise", metavar="NAME", help="run only the tests of this exercise")
    p.add_argument(
        "-k", dest="keyword", metavar="EXPR", help="run only the tests matching EXPR (as pytest -k)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="hard cap in seconds on each test's whole time (default 60 on cpu, 120 on cuda); "
        "learner code is stopped sooner, at the test's budget (judge/budgets.json)",
    )
    p.add_argument(
        "--time-limit", type=float, default=None, help="seconds for the whole run (default 900)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="test processes sharing the tests (default: MINISGL_JUDGE_JOBS, else one per CPU "
        "core up to 4 on a CPU, 1 on a GPU)",
    )
    p.add_argument(
        "--hint",
        action="count",
        default=0,
        help="show hints for the unfinished exercises instead of judging; repeat (or --hint "
        "N) for more",
    )
    p.add_argument("--hint-level", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="list every test, passing ones too")
    p.add_argument(
        "--selfcheck",
        action="store_true",
        help="prove the judge: reference passes, each stub fails exactly its tests, variants "
        "are caught",
    )
    p.add_argument(
        "--workers", type=int, default=2, help="parallel test processes for --selfcheck (default 2)"
    )
    return p


def _normalize_hint(argv: Sequence[str]) -> List[str]:
    """`--hint 2` means level 2; a bare `--hint` (repeatable) counts. argparse cannot do both
    alone."""
    out: List[str] = []
    it = list(argv)
    i = 0
    while i < len(it):
        if it[i] == "--hint" and i + 1 < len(it) and re.fullmatch(r"\d+", it[i + 1]):
            out += ["--hint-level", it[i + 1]]
            i += 2
            continue
        if it[i].startswith("--hint="):
            out += ["--hint-level", it[i].split("=", 1)[1]]
        else:
            out.append(it[i])
        i += 1
    return out


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
        args = build_parser().parse_args(_normalize_hint(argv))
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
    from . import progress, report

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
        return _hints(chapters, chapter, hint_level, args, console)
    check_requirements(chapters)  # before reading the learner's code: the fix is an install
    if args.variant:
        return _variants(chapter, chapters, args, console)

    options = _options(args)
    selectors = _selectors(chapter, args.exercise) if args.exercise else None
    from .judging import judge

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
                report.to_json(
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


def _options(args: argparse.Namespace):
    from .runner import RunOptions, default_jobs

    if any(v is not None and v <= 0 for v in (args.timeout, args.time_limit, args.jobs)):
        raise UsageError("--timeout, --time-limit and --jobs must be positive")
    return RunOptions(
        device=args.device,
        test_timeout=args.timeout,
        time_limit=args.time_limit,
        keyword=args.keyword,
        jobs=args.jobs if args.jobs is not None else default_jobs(args.device),
    )


def _selectors(chapter: Chapter, name: str) -> List[str]:
    ex = chapter.exercise(name)
    if not ex.tests:
        raise UsageError(f"{ex.id} has no tests listed in the registry yet")
    by_name = {f.name: f for f in chapter.test_files}
    out = []
    for ref in ex.tests:
        file, _, rest = ref.partition("::")
        path = by_name.get(Path(file).name)
        if path is None:
            raise UsageError(f"{ex.id}: test {ref} is not in the chapter's test files")
        out.append(f"{path}::{rest}" if rest else str(path))
    return out


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
    from . import report
    from .judging import not_attempted

    verdict = not_attempted(chapters, origin, options.device)
    if _not_recorded(target, args, options) is None:
        from . import progress

        progress.record(verdict, chapters, codes)
    if args.json:
        print(json.dumps({**report.to_json(verdict, chapters), "not_started": True}, indent=1))
    else:
        report.render_not_started(verdict, chapters, console, _hint_command(chapters[-1], args))
    return EXIT_OK


def _static_verdict(chapters, codes, options, origin: str):
    from .judging import ERROR, ExerciseVerdict, Verdict

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


def _hints(chapters: Sequence[Chapter], chapter: Chapter, level: int, args, console) -> int:
    """Hints for what is unfinished in the source being judged now (hints never run the tests): with
    --file, the exercises the file defines (a file's runs are not recorded, so each may still be
    wrong); else the notebook's exercises, read as saved, less those that passed at its last
    recorded
    run and have not changed since."""
    from . import progress, report
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
    exercises = report.hinted(chapters, status, only=args.exercise)
    if args.json:
        print(json.dumps({"hints": {e.id: list(e.hints[:level]) for e in exercises}}, indent=1))
    else:
        report.render_hints(exercises, console, level)
    return EXIT_OK


def variant_name(chapter: Chapter, path: Path) -> str:
    return path.stem[len(chapter.key) + 1 :]


def _variants(chapter: Chapter, chapters, args, console) -> int:
    from rich.text import Text

    from . import report
    from .judging import judge
    from .sources import from_file

    known = [variant_name(chapter, p) for p in variant_files(chapter)]
    if args.variant == "list":
        for path in variant_files(chapter):
            console.print(Text(f"{variant_name(chapter, path)}: {variant_doc(path)}"))
        if not known:
            console.print(f"{chapter.key} has no known-wrong variants")
        return EXIT_OK
    paths = variant_files(chapter, args.variant)
    if not paths:
        raise UsageError(
            f"no variant {args.variant!r} for {chapter.key}; known: {', '.join(known) or 'none'}"
        )
    options = _options(args)
    selectors = _selectors(chapter, args.exercise) if args.exercise else None
    all_caught = True
    results = []
    for path in paths:
        code = from_file(path, chapter, missing="reference", origin=f"judge/variants/{path.name}")
        name = variant_name(chapter, path)
        verdict = judge(
            chapters,
            {chapter.key: code},
            options,
            mode=f"variant {name}",
            origin=variant_doc(path),
            selectors=selectors,
        )
        caught = [t.test for t in verdict.tests if not t.ok]
        broken = bool(code.problems) or any(t.standin for t in verdict.tests)
        all_caught &= bool(caught) and not broken
        results.append(
            {
                "variant": name,
                "caught_by": caught,
                "broken": broken,
                "verdict": report.to_json(verdict, chapters),
            }
        )
        if not args.json:
            report.render(verdict, chapters, console, verbose=args.verbose)
            if broken:
                console.print(
                    Text(f"variant {name} itself does not load: see above", style="bold red")
                )
            elif caught:
                console.print(
                    Text(f"variant {name} is caught by {len(caught)} test(s).", style="bold green")
                )
            else:
                console.print(Text(f"variant {name} is NOT caught by any test.", style="bold red"))
            console.print()
    if args.json:
        print(json.dumps({"caught": all_caught, "variants": results}, indent=1))
    return EXIT_OK if all_caught else EXIT_FAILED


def variant_doc(path: Path) -> str:
    import ast

    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError):
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph, on one line


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


__all__ = ["main"]
