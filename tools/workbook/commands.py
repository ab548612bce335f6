"""The tool's commands: build, execute, refresh, check, site, learner, timings. Each takes
optional chapter ids ("ch11") and works on every chapter when given none."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Iterable, List

import nbformat

from . import execute as runner
from . import notebook, site
from .paths import CHAPTERS, NOTEBOOKS, REPO, SITE_DOCS, SOLUTIONS
from .source import Chapter, chapter_files, read_chapter


def chapters(ids: Iterable[str] = ()) -> List[Chapter]:
    ids = list(ids)
    found = [read_chapter(p) for p in chapter_files(CHAPTERS)]
    if ids:
        unknown = set(ids) - {c.chapter for c in found}
        if unknown:
            raise SystemExit(
                f"no chapter source for {', '.join(sorted(unknown))} in "
                f"{CHAPTERS.relative_to(REPO)}/"
            )
        found = [c for c in found if c.chapter in ids]
    return found


def learner_path(ch: Chapter) -> Path:
    return NOTEBOOKS / f"{ch.stem}.ipynb"


def solution_path(ch: Chapter) -> Path:
    return SOLUTIONS / f"{ch.stem}.ipynb"


def _rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


# ---------------------------------------------------------------- build / execute


def build(ids: Iterable[str] = ()) -> int:
    """Write the learner notebooks. Solutions are written by `execute` (they need outputs)."""
    NOTEBOOKS.mkdir(exist_ok=True)
    for ch in chapters(ids):
        path = learner_path(ch)
        text = notebook.dumps(notebook.render(ch, "learner"))
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {_rel(path)}")
        else:
            print(f"{_rel(path)} is up to date")
    return 0


def execute(ids: Iterable[str] = ()) -> int:
    """Render and run each solution notebook; write it with its outputs and its run time."""
    SOLUTIONS.mkdir(exist_ok=True)
    build(ids)
    failed = False
    for ch in chapters(ids):
        nb = notebook.render(ch, "solution")
        print(f"executing {ch.stem} ...", flush=True)
        result = runner.run(nb, SOLUTIONS)
        nb = runner.sanitize(result.nb)
        nb.metadata["minisgl"]["execution"] = {"seconds": round(result.seconds, 1)}
        solution_path(ch).write_text(notebook.dumps(nb), encoding="utf-8")
        print(f"wrote {_rel(solution_path(ch))} ({result.seconds:.1f} s)")
        for problem in tryout_problems(ch, nb) + milestone_problems(ch, nb):
            print(f"FAIL {problem}")
            failed = True
    return 1 if failed else 0


def _code_cells(nb: nbformat.NotebookNode) -> List[tuple]:
    return [
        (_without_docstrings(c.source), c.metadata.get("tags", []))
        for c in nb.cells
        if c.cell_type == "code"
    ]


def _without_docstrings(source: str) -> str:
    """A cell's code with its docstrings left out: an edited docstring (an exercise's contract)
    cannot change what the cell prints, so it needs no new run."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython syntax (%magic): compare as written
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def refresh(ids: Iterable[str] = ()) -> int:
    """Bring solutions up to date without running them when only prose or listings changed: the
    outputs of the saved notebook are kept if every code cell is unchanged. Otherwise: `execute`."""
    build(ids)
    failed = False
    for ch in chapters(ids):
        path = solution_path(ch)
        fresh = notebook.render(ch, "solution")
        if not path.is_file():
            print(f"{_rel(path)} is missing: run `python -m tools.workbook execute {ch.chapter}`")
            failed = True
            continue
        saved = nbformat.read(path, as_version=4)
        if _code_cells(fresh) != _code_cells(saved):
            print(
                f"{_rel(path)}: code cells changed, its outputs must be made again: "
                f"run `python -m tools.workbook execute {ch.chapter}`"
            )
            failed = True
            continue
        runs = iter([c for c in saved.cells if c.cell_type == "code"])
        for cell in fresh.cells:
            if cell.cell_type == "code":
                old = next(runs)
                cell.outputs, cell.execution_count = old.outputs, old.execution_count
        fresh.metadata["minisgl"]["execution"] = saved.metadata.get("minisgl", {}).get(
            "execution", {}
        )
        if "language_info" in saved.metadata:  # written by the kernel that made the outputs: keep
            fresh.metadata["language_info"] = saved.metadata["language_info"]
        text = notebook.dumps(fresh)
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {_rel(path)} (prose and listings updated, outputs kept)")
        else:
            print(f"{_rel(path)} is up to date")
    return 1 if failed else 0


# ---------------------------------------------------------------- check (staleness)


def stale(ch: Chapter) -> List[str]:
    """Why the derived files of `ch` do not match its source; empty when they do."""
    problems = []
    lp, sp = learner_path(ch), solution_path(ch)
    want = notebook.dumps(notebook.render(ch, "learner"))
    if not lp.is_file():
        problems.append(f"{_rel(lp)} is missing")
    elif lp.read_text(encoding="utf-8") != want:
        problems.append(f"{_rel(lp)} differs from what {_rel(ch.path)} gives")
    if not sp.is_file():
        problems.append(f"{_rel(sp)} is missing")
        return problems
    saved = nbformat.read(sp, as_version=4)
    fresh = notebook.strip_outputs(notebook.render(ch, "solution"))
    if notebook.dumps(notebook.strip_outputs(saved)) != notebook.dumps(fresh):
        problems.append(f"{_rel(sp)}: its cells differ from what {_rel(ch.path)} and minisgl give")
    unrun = [c.id for c in saved.cells if c.cell_type == "code" and c.execution_count is None]
    if unrun:
        problems.append(f"{_rel(sp)}: cell(s) {', '.join(unrun)} were not executed")
    return problems


def check(ids: Iterable[str] = ()) -> int:
    failed = False
    known = {learner_path(c).name for c in chapters()}
    for ch in chapters(ids):
        problems = stale(ch)
        for p in problems:
            print(f"STALE {p}")
        failed |= bool(problems)
        if not problems:
            print(f"ok    {ch.stem}")
    if not list(ids):  # notebooks without a source are left-overs of a renamed chapter
        for folder in (NOTEBOOKS, SOLUTIONS):
            for p in sorted(folder.glob("*.ipynb")) if folder.is_dir() else []:
                if p.name not in known:
                    print(f"STALE {_rel(p)} has no source in chapters/")
                    failed = True
    if failed:
        print(
            "\nrebuild with `python -m tools.workbook refresh` (learner notebooks, and "
            "solutions whose code "
            "cells did not change) or `python -m tools.workbook execute chNN` (runs the solution)"
        )
    return 1 if failed else 0


# ---------------------------------------------------------------- site


def build_site(ids: Iterable[str] = ()) -> int:
    site.reset(SITE_DOCS)
    site.copy_site_files(SITE_DOCS)
    for ch in chapters(ids):
        problems = stale(ch)
        if problems:
            raise SystemExit("\n".join(f"STALE {p}" for p in problems))
        solution = nbformat.read(solution_path(ch), as_version=4)
        page = site.render_page(ch, solution, SITE_DOCS)
        site.copy_notebooks(
            ch, NOTEBOOKS / f"{ch.stem}.ipynb", SOLUTIONS / f"{ch.stem}.ipynb", SITE_DOCS
        )
        (SITE_DOCS / f"{ch.stem}.md").write_text(page, encoding="utf-8")
        print(f"wrote {_rel(SITE_DOCS / (ch.stem + '.md'))}")
    return 0


# ---------------------------------------------------------------- learner notebooks run


def student_errors(ch: Chapter, nb: nbformat.NotebookNode) -> List[str]:
    """Every error of a run: in JupyterLab any of them stops "Run All". Try-outs of a stub run
    inside `attempt(...)`, which turns the stub's NotImplementedError into a note."""
    problems = []
    for cell in nb.cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if not errors:
            continue
        err = errors[0]
        where = "exercise cell" if notebook.cell_kind(cell) == "exercise" else "cell"
        why = ""
        if err.get("ename") == "NotImplementedError" and str(err.get("evalue", "")).startswith(
            f"{ch.chapter}."
        ):
            why = " (a stub called outside `with attempt(...)`)"
        problems.append(
            f"{ch.stem} {where} {cell.id}: {err.get('ename')}: {err.get('evalue')}{why}\n"
            f"    {cell.source.splitlines()[0] if cell.source else ''}"
        )
    from classroom.tryout import NOT_WRITTEN  # (imports torch: only where notebooks run anyway)

    for cell in nb.cells:  # a try-out that stays silent before its function is written
        if (
            notebook.cell_kind(cell) == "exercise"
            and tryout_checks(cell)
            and NOT_WRITTEN not in _text(cell)
        ):
            problems.append(
                f"{ch.stem} exercise cell {cell.id}: its try-out does not say the function "
                f"is not written yet (run it inside `with attempt(...)`)"
            )
    return problems


def tryout_checks(cell) -> bool:
    """Whether an exercise cell's try-out checks the function (calls `check(...)`)."""
    return "check(" in cell.source


def tryout_problems(ch: Chapter, nb: nbformat.NotebookNode) -> List[str]:
    """In an executed solution: each try-out that checks must print only ✔ lines, at least one."""
    from classroom.tryout import FAIL, PASS

    problems = []
    for cell in nb.cells:
        if notebook.cell_kind(cell) != "exercise" or not tryout_checks(cell):
            continue
        text = _text(cell)
        if FAIL in text or PASS not in text:
            seen = [ln for ln in text.splitlines() if ln.startswith((PASS, FAIL))] or [
                "no ✔ line at all"
            ]
            problems.append(
                f"{ch.stem} exercise cell {cell.id}: the reference's try-out does not pass its own "
                f"checks: {'; '.join(seen)}"
            )
    return problems


def milestone_problems(ch: Chapter, nb: nbformat.NotebookNode) -> List[str]:
    """In an executed milestone, run on the solutions: each run must say that its tokens and counts
    equal the reference's (a ✔ line), and nothing must fail (no ✘)."""
    from classroom.tryout import FAIL, PASS

    if not ch.is_milestone:
        return []
    text = "".join(_text(c) for c in nb.cells if c.cell_type == "code")
    if PASS in text and FAIL not in text:
        return []
    seen = [ln for ln in text.splitlines() if ln.startswith((PASS, FAIL))] or ["no ✔ line at all"]
    return [f"{ch.stem}: the solutions' run is not the reference's: {'; '.join(seen)}"]


def _text(cell) -> str:
    return "".join(
        o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"
    )


def _report(problems: List[str], ok: str) -> bool:
    """Print each problem as a FAIL line, or the ok line; True when something failed."""
    for p in problems:
        print(f"FAIL {p}")
    if not problems:
        print(f"ok   {ok}")
    return bool(problems)


def timings(ids: Iterable[str] = ()) -> int:
    for ch in chapters(ids):
        p = solution_path(ch)
        if p.is_file():
            secs = (
                json.loads(p.read_text())
                .get("metadata", {})
                .get("minisgl", {})
                .get("execution", {})
                .get("seconds")
            )
            print(f"{ch.stem}: {secs} s")
    return 0


def learner(ids: Iterable[str] = ()) -> int:
    """Each learner notebook as a learner meets it, its try-outs held to the judge on the way
    (learner_run.py): no error to the end, ✔ with only the exercise written, ✘ with each variant.
    `--jobs N` among the ids: N chapters at a time, each in its own process (by_chapter.py)."""
    ids, jobs = _jobs_option(list(ids))
    if jobs > 1 and len(chapters(ids)) > 1:
        from . import by_chapter

        return by_chapter.run("learner", chapters(ids), jobs, solution_path)
    from .learner_run import run_chapter

    failed = False
    for ch in chapters(ids):
        nb, problems, oks, seconds = run_chapter(ch)
        kept = REPO / "build" / "students" / f"{ch.stem}.ipynb"  # what a learner sees, for a look
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(notebook.dumps(nb), encoding="utf-8")
        problems += student_errors(ch, nb)
        for line in oks:
            print(f"ok   {line}")
        for p in problems:
            print(f"FAIL {p}")
        print(
            f"{'FAIL' if problems else 'ok  '} {ch.stem}: the learner's run reaches the end "
            f"({seconds:.1f} s, {len(oks)} try-out checks passed); run kept in {_rel(kept)}"
        )
        failed |= bool(problems)
    return 1 if failed else 0


def _jobs_option(args: List[str]) -> tuple:
    """(the chapter ids, N) from `[chNN ...] [--jobs N]`; N is 1 without the option."""
    if "--jobs" not in args:
        return args, 1
    at = args.index("--jobs")
    value = args[at + 1] if at + 1 < len(args) else ""
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(
            f"--jobs needs a number of chapters to run at a time (1 or more), got {value!r}"
        )
    return args[:at] + args[at + 2 :], int(value)


def main(argv: List[str]) -> int:
    usage = (
        "usage: python -m tools.workbook COMMAND [chNN ...]\n"
        "  build     write the learner notebooks (notebooks/)\n"
        "  execute   build, then run the solution notebooks and write them with outputs "
        "(solutions/)\n"
        "  refresh   update solutions whose code cells did not change (prose, listings), "
        "keeping their outputs\n"
        "  check     fail if a generated notebook does not match its chapter source (what CI "
        "runs)\n"
        "  site      write the site's pages into build/site_docs/ (then: mkdocs build --strict)\n"
        "  learner   run the learner notebooks as a learner meets them (stubs; no error to the "
        "end), each checking try-out ✔ with only its exercise written and ✘ with each "
        "known-wrong variant of judge/variants/ and 90 % of the judge's killed mutants of the "
        "last `python -m tools.mutants --sample 5`; `--jobs N`: N chapters at a time\n"
        "  timings   the execution time recorded in each solution notebook"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    commands = {
        "build": build,
        "execute": execute,
        "refresh": refresh,
        "check": check,
        "site": build_site,
        "learner": learner,
        "timings": timings,
    }
    cmd, ids = argv[0], argv[1:]
    if cmd not in commands:
        print(usage, file=sys.stderr)
        return 2
    return commands[cmd](ids)
