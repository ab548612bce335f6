"""The grade book: a per-student x per-exercise table (CSV and JSON) and an HTML report.

The HTML report has, per exercise, how many submissions pass it and its most frequent failure
lines (what to go over in class), and per student the lines the learner would have seen.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import jinja2

from .points import Points
from .run import JUDGED, PASSING, Verdict


@dataclass
class Score:
    earned: float
    possible: float


def score(verdict: Verdict, points: Points) -> Score:
    possible = sum(points.of(e.id) for e in verdict.exercises)
    # Only a run that finished counts: after a crash no "passing" can be trusted.
    trusted = verdict.outcome == JUDGED
    earned = sum(points.of(e.id) for e in verdict.exercises if trusted and e.status == PASSING)
    return Score(round(earned, 4), round(possible, 4))


def exercise_ids(verdicts: Sequence[Verdict]) -> List[str]:
    ids: List[str] = []
    for v in verdicts:
        for e in v.exercises:
            if e.id not in ids:
                ids.append(e.id)
    return sorted(ids, key=lambda i: (i.split(".")[0], ids.index(i)))


def write_csv(path: Path, verdicts: Sequence[Verdict], points: Points) -> None:
    """One row per student and chapter; one column per exercise, holding the judge's status."""
    ids = exercise_ids(verdicts)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "chapter", "outcome", "score", "max_score", *ids, "reason"])
        for v in verdicts:
            s = score(v, points)
            status = {e.id: e.status for e in v.exercises}
            w.writerow(
                [v.student, v.chapter, v.outcome, s.earned, s.possible]
                + [status.get(i, "") for i in ids]
                + [v.reason or ""]
            )


def write_json(
    path: Path, verdicts: Sequence[Verdict], points: Points, containment: List[str]
) -> None:
    rows = []
    for v in verdicts:
        s = score(v, points)
        rows.append({**v.to_json(), "score": s.earned, "max_score": s.possible})
    path.write_text(
        json.dumps(
            {"exercises": exercise_ids(verdicts), "containment": containment, "submissions": rows},
            indent=1,
        )
    )


def summary(verdicts: Sequence[Verdict], top: int = 5) -> List[dict]:
    """Per exercise: how many pass, of how many submissions, and the most frequent failure lines."""
    out: Dict[str, dict] = {}
    for ex_id in exercise_ids(verdicts):
        results = [(v, e) for v in verdicts for e in v.exercises if e.id == ex_id]
        lines = Counter(line for _, e in results for line in dict.fromkeys(e.failures))
        out[ex_id] = {
            "id": ex_id,
            # a submission without a verdict passes nothing, whatever its exercises said
            "passing": sum(v.outcome == JUDGED and e.status == PASSING for v, e in results),
            "submissions": len(results),
            "frequent_failures": lines.most_common(top),
        }
    return list(out.values())


TEMPLATE = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent),
    autoescape=True,  # learners' failure lines are text, never markup
    undefined=jinja2.StrictUndefined,
).get_template("report.html.j2")


def write_html(
    path: Path, verdicts: Sequence[Verdict], points: Points, containment: List[str]
) -> None:
    rows = [
        {"v": v, "s": score(v, points), "status": {e.id: e.status for e in v.exercises}}
        for v in verdicts
    ]
    chapters = ", ".join(sorted({v.chapter for v in verdicts}))
    path.write_text(
        TEMPLATE.render(
            chapters=chapters,
            verdicts=verdicts,
            rows=rows,
            ids=exercise_ids(verdicts),
            summary=summary(verdicts),
            containment=containment,
        )  # fmt: skip
    )


def judged(verdicts: Sequence[Verdict]) -> int:
    return sum(v.outcome == JUDGED for v in verdicts)
