"""judge.py's command line: the parser (`build_parser`, `normalize_hint`), the exit codes, and
what the arguments turn into (the run's options, the selectors of one exercise's tests, the
notebooks folder). Shared by cli.py, cli_hints.py and cli_variants.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import List, Sequence

from . import settings
from .registry import REPO, Chapter, RegistryError, load_registry
from .settings import SettingError

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
        "python judge.py --selfcheck ch09 | python judge.py serve ch13 (your code behind the "
        "HTTP API; python judge.py serve --help)",
    )
    p.add_argument("chapter", nargs="?", help=f"a chapter: {_chapter_range()} (or just 11)")
    _add_source_arguments(p)
    _add_run_arguments(p)
    _add_output_arguments(p)
    return p


def _add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Whose code is judged: the notebook (default), a file, the reference or a variant."""
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
        help="run a known-wrong variant (judge/variants/chNN_NAME*) "
        "and show which tests catch it; 'list' lists them",
    )
    p.add_argument(
        "--cumulative",
        action="store_true",
        help="swap in your exercises of every chapter up to this one and run all their tests",
    )


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Which tests run, where, and for how long."""
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


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Hints, JSON, verbosity and the self-check in place of a plain verdict."""
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


def normalize_hint(argv: Sequence[str]) -> List[str]:
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


def run_options(args: argparse.Namespace):
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


def exercise_selectors(chapter: Chapter, name: str) -> List[str]:
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
