"""`python judge.py chNN --variant NAME`: judge a known-wrong variant (judge/variants/) and say
which tests catch it; `--variant list` lists the chapter's variants."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_args import EXIT_FAILED, EXIT_OK, UsageError, exercise_selectors, run_options
from .registry import Chapter, variant_files


def variant_name(chapter: Chapter, path: Path) -> str:
    return path.stem[len(chapter.key) + 1 :]


def run_variants(chapter: Chapter, chapters, args, console) -> int:
    from rich.text import Text

    from . import report_json
    from .judging import judge
    from .variant_edits import VariantError, variant_code, variant_diff

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
    options = run_options(args)
    selectors = exercise_selectors(chapter, args.exercise) if args.exercise else None
    all_caught = True
    results = []
    for path in paths:
        name = variant_name(chapter, path)
        try:
            code = variant_code(path, chapter)
        except (VariantError, LookupError) as e:
            console.print(Text(f"variant {name} cannot be built: {e}", style="bold red"))
            all_caught = False
            results.append({"variant": name, "caught_by": [], "broken": True, "error": str(e)})
            continue
        if not args.json:
            console.print(Text(f"variant {name}, what it changes:", style="bold"))
            console.print(Text(variant_diff(path)))
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
                "verdict": report_json.to_json(verdict, chapters),
            }
        )
        if not args.json:
            _show(verdict, chapters, console, args.verbose, name, caught, broken)
    if args.json:
        print(json.dumps({"caught": all_caught, "variants": results}, indent=1))
    return EXIT_OK if all_caught else EXIT_FAILED


def _show(verdict, chapters, console, verbose: bool, name: str, caught, broken: bool) -> None:
    from rich.text import Text

    from . import report

    report.render(verdict, chapters, console, verbose=verbose)
    if broken:
        console.print(Text(f"variant {name} itself does not load: see above", style="bold red"))
    elif caught:
        console.print(
            Text(f"variant {name} is caught by {len(caught)} test(s).", style="bold green")
        )
    else:
        console.print(Text(f"variant {name} is NOT caught by any test.", style="bold red"))
    console.print()


def variant_doc(path: Path) -> str:
    """The variant's summary: the first paragraph of its description, on one line."""
    from .variant_edits import VariantError, read_variant

    try:
        return read_variant(path).summary()
    except (OSError, VariantError) as e:
        return f"(unreadable: {e})"
