"""What every registered exercise must have beyond its registry entry (judge/README.md, "Adding an
exercise"), checked from the files alone (no test is run):

* tests: at least one, each naming a test function of the chapter's test files;
* a known-wrong variant: a file of judge/variants/ that the judge's loader reads as a version of
  the exercise (the self-check proves the tests fail it), or the reason it has none in its
  registry entry, `no_variant = "..."`;
* budgets: a measured CPU time in judge/budgets.json for each of its tests
  (`python -m judge.measure_budgets chNN`);
* a try-out check: its `{exercise} chNN.name` cell in chapters/chNN_*.md calls `check(...)`
  (classroom.tryout), so the notebook flags a mistake before the judge is run;
* a row in the table of what each try-out catches (chapters/README.md).

    python -m tools.exercise_checklist        # every chapter; exit 1 and the list if one lacks any
    python -m tools.exercise_checklist ch21   # one chapter
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

from judge.budgets import test_key
from judge.registry import REPO, Chapter, Exercise, load_registry, variant_files
from judge.sources import SourceError
from judge.variant_edits import VariantError, variant_code

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

# what an exercise may lack, each a short kind and a sentence saying what to add
TESTS, VARIANT, BUDGET, TRYOUT, TABLE = "tests", "variant", "budget", "try-out", "table row"
Gap = Tuple[str, str]

CHECK_CALL = re.compile(r"\bcheck\(")
CHAPTER_HEADING = re.compile(r"^#+ .*\((ch\d\d)\)")


@dataclass(frozen=True)
class Layout:
    """Where the files an exercise needs are (the repository's, or a test's copy)."""

    budgets: Path = REPO / "judge" / "budgets.json"
    chapters: Path = REPO / "chapters"  # chNN_*.md sources
    table: Path = REPO / "chapters" / "README.md"  # "What each try-out catches"


def missing(chapter: Chapter, layout: Layout = Layout()) -> Dict[str, List[Gap]]:
    """Exercise id -> what it lacks, (kind, what to add) each, for the exercises of `chapter` that
    lack something."""
    test_names = _test_functions(chapter)
    with_variants = _exercises_with_variants(chapter) | set(_no_variant_reasons(chapter))
    measured = set(json.loads(layout.budgets.read_text(encoding="utf-8"))["times"].get("cpu", {}))
    tryouts = _tryout_cells(chapter, layout.chapters)
    rows = _table_rows(layout.table)
    out: Dict[str, List[Gap]] = {}
    for ex in chapter.exercises:
        lacks = [(TESTS, text) for text in _missing_tests(ex, test_names)]
        if ex.name not in with_variants:
            lacks.append(
                (
                    VARIANT,
                    f"a known-wrong variant (judge/variants/{chapter.key}_<mistake>.diff editing "
                    f'`{ex.attr}`), or no_variant = "<why>" in its registry entry',
                )
            )
        unmeasured = [t for t in ex.tests if not _measured(t, measured)]
        if unmeasured:
            lacks.append(
                (
                    BUDGET,
                    f"a CPU budget for {len(unmeasured)} of its tests (first: {unmeasured[0]}; "
                    f"python -m judge.measure_budgets {chapter.key})",
                )
            )
        cell = tryouts.get(ex.id)
        if cell is None:
            lacks.append((TRYOUT, f"an {{exercise}} {ex.id} cell in chapters/{chapter.key}_*.md"))
        elif not CHECK_CALL.search(cell):
            lacks.append((TRYOUT, f"a try-out check: its {ex.id} cell calls no check(...)"))
        if (chapter.key, ex.name) not in rows:
            lacks.append(
                (
                    TABLE,
                    f"a row for {ex.name} under {chapter.key} in {_rel(layout.table)}'s table of "
                    "what each try-out catches",
                )
            )
        if lacks:
            out[ex.id] = lacks
    return out


def _no_variant_reasons(chapter: Chapter) -> Dict[str, str]:
    """Exercise name -> why it has no known-wrong variant (`no_variant` in its registry entry)."""
    raw = tomllib.loads(load_registry().path.read_text(encoding="utf-8"))
    entries = raw.get(chapter.key, {}).get("exercises", [])
    return {e["name"]: e["no_variant"] for e in entries if str(e.get("no_variant", "")).strip()}


def _missing_tests(ex: Exercise, test_names: Dict[str, Set[str]]) -> List[str]:
    if not ex.tests:
        return ["tests (its `tests` list in judge/exercises.toml is empty)"]
    lacks = []
    for ref in ex.tests:
        file, _, name = ref.partition("::")
        if name.split("[", 1)[0] not in test_names.get(Path(file).name, set()):
            lacks.append(f"its test {ref} (no such test function in the chapter's test files)")
    return lacks


def _test_functions(chapter: Chapter) -> Dict[str, Set[str]]:
    """Test file name -> the names of the functions it defines."""
    out: Dict[str, Set[str]] = {}
    for path in chapter.test_files:
        tree = ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else ast.Module([], [])
        out[path.name] = {
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
    return out


def _exercises_with_variants(chapter: Chapter) -> Set[str]:
    """The names of the exercises some variant file is a version of, read as the self-check
    reads them (judge/selfcheck.py)."""
    names: Set[str] = set()
    for path in variant_files(chapter):
        try:
            code = variant_code(path, chapter)
        except (SourceError, VariantError, LookupError):
            continue  # a variant that does not load is the self-check's to report
        names.update(ex.name for ex in chapter.exercises if code.swaps(ex.name))
    return names


def _measured(ref: str, measured: Set[str]) -> bool:
    key = test_key(ref)
    return key in measured or any(m.startswith(key + "[") for m in measured)


def _tryout_cells(chapter: Chapter, folder: Path) -> Dict[str, str]:
    """Exercise id -> the body of its `{exercise}` block in the chapter's source."""
    out: Dict[str, str] = {}
    for source in sorted(folder.glob(f"{chapter.key}_*.md")):
        text = source.read_text(encoding="utf-8")
        for m in re.finditer(r"^```\{exercise\} (ch\d\d\.\w+)[^\n]*\n(.*?)^```", text, re.S | re.M):
            out[m.group(1)] = m.group(2)
    return out


def _table_rows(table: Path) -> Set[tuple]:
    """(chapter, exercise) of each row of the try-out tables: a row `| chNN | name | ...`, or
    `| name | ...` under a heading that names the chapter `(chNN)`."""
    rows: Set[tuple] = set()
    chapter = None
    for line in table.read_text(encoding="utf-8").splitlines():
        heading = CHAPTER_HEADING.match(line)
        if heading:
            chapter = heading.group(1)
        elif line.startswith("|"):
            cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            if len(cells) > 1 and re.fullmatch(r"ch\d\d", cells[0]):
                rows.add((cells[0], cells[1]))
            elif chapter is not None:
                rows.add((chapter, cells[0]))
    return rows


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def report(gaps: Dict[str, List[Gap]]) -> str:
    return "\n".join(
        f"{ex} lacks " + "; ".join(text for _, text in lacks) for ex, lacks in gaps.items()
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.exercise_checklist", description=__doc__)
    parser.add_argument("chapters", nargs="*", help="chapter ids (default: all)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    registry = load_registry()
    chapters = [registry.chapter(c) for c in args.chapters] or list(registry.chapters.values())
    gaps: Dict[str, List[Gap]] = {}
    for chapter in chapters:
        gaps.update(missing(chapter))
    if gaps:
        print(report(gaps))
        return 1
    print(f"every exercise of {len(chapters)} chapter(s) has all it needs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
