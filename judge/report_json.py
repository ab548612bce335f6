"""A verdict as JSON (`python judge.py chNN --json`, --variant's report): what the screen shows,
for machines."""

from __future__ import annotations

import dataclasses
from typing import Dict, Sequence

from .registry import Chapter
from .verdicts import Verdict


def to_json(verdict: Verdict, chapters: Sequence[Chapter], not_recorded: str | None = None) -> Dict:
    """The verdict as the screen shows it: per exercise its status, its tests that pass out of its
    own (`passed`/`total`, overlapping between exercises), whether it passes only on its own, and
    the learner lines the report shows under it (`where`, by test)."""
    return {
        "recorded": verdict.mode == "learner" and not not_recorded,
        "not_recorded": not_recorded,
        "chapters": verdict.chapters,
        "mode": verdict.mode,
        "origin": verdict.origin,
        "device": verdict.device,
        "passed": verdict.passed,
        "wall_s": round(verdict.wall, 2),
        "counts": verdict.counts,
        "general": verdict.general,
        "exercises": [
            {
                "id": e.id,
                "chapter": e.chapter,
                "name": e.name,
                "target": e.target,
                "status": e.status,
                "problem": e.problem,
                "attempted": e.attempted,
                "note": e.note,
                "alone": e.alone,
                "passed": e.passed_count,
                "total": len(e.tests),
                "tests": [t.test for t in e.tests],
                "where": {t.test: e.where(t) for t in e.tests if not t.ok and e.where(t)},
            }
            for e in verdict.exercises
        ],
        "tests": [dataclasses.asdict(t) for t in verdict.tests],
    }
