"""Hints, gentlest first, for the exercises that are not passing yet (`--hint`, `judge.check(...,
hint=N)`): which exercises get them (`hinted`) and how they are printed (`render_hints`)."""

from __future__ import annotations

from typing import Dict, List, Sequence

from rich.console import Console
from rich.text import Text

from .registry import Chapter, Exercise
from .verdicts import PASSING, REFERENCE


def hinted(
    chapters: Sequence[Chapter], status: Dict[str, str], only: str | None = None
) -> List[Exercise]:
    """The exercises to give hints for: `only` (a name or id), else every one whose status (by id)
    is not passing."""
    exercises = [ex for chapter in chapters for ex in chapter.exercises]
    if only:
        return [ex for ex in exercises if only in (ex.name, ex.attr, ex.id)]
    return [ex for ex in exercises if status.get(ex.id) not in (PASSING, REFERENCE)]


def render_hints(
    exercises: Sequence[Exercise], console: Console, level: int, in_notebook: bool = False
) -> None:
    """Hints 1..level for each of `exercises` (see `hinted`); `in_notebook`: asked with
    judge.check."""
    for ex in exercises:
        console.print(Text(f"Hints for {ex.id} (`def {ex.attr}`):", style="bold cyan"))
        if not ex.hints:
            console.print(
                Text(
                    "   (no hints written for this exercise yet: read its docstring and the "
                    "chapter's notebook)",
                    style="dim",
                )
            )
        for i, h in enumerate(ex.hints[:level], start=1):
            console.print(Text(f"   {i}. ") + Text(h))
        if ex.hints and level < len(ex.hints):
            more = min(level + 1, len(ex.hints))
            console.print(
                Text(
                    f"   ({len(ex.hints) - level} more: "
                    f"{f'hint={more}' if in_notebook else f'--hint {more}'})",
                    style="dim",
                )
            )
    if not exercises:
        console.print(
            Text(
                "Every exercise here passed when your notebook was last judged, and none has "
                "changed "
                "since: no hints needed (--exercise NAME shows one exercise's hints anyway).",
                style="green",
            )
        )
