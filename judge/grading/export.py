"""The formats classrooms use: Gradescope's autograder results.json and JUnit XML.

Gradescope (https://gradescope-autograders.readthedocs.io/en/latest/specs/): one results.json
per submission, with a test per exercise (score, max_score, status, output: the failing lines).
JUnit: one <testsuite> per submission, one <testcase> per exercise, a <failure> for an exercise
that does not pass (its lines as the text), read by CI dashboards (GitLab, Jenkins, GitHub
actions that publish test results).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Sequence

from .points import Points
from .report import score
from .run import JUDGED, PASSING, Verdict


def gradescope(verdict: Verdict, points: Points) -> dict:
    s = score(verdict, points)
    tests = []
    for number, e in enumerate(verdict.exercises, 1):
        worth = points.of(e.id)
        earned = verdict.outcome == JUDGED and e.status == PASSING
        lines = [f"{e.status}" + (f": {e.passed} of {e.total} tests pass" if e.total else "")]
        tests.append(
            {
                "name": e.id,
                "number": str(number),
                "score": worth if earned else 0.0,
                "max_score": worth,
                "status": "passed" if earned else "failed",
                "output": "\n".join(lines + e.failures),
                "visibility": "visible",
            }
        )
    output = f"{verdict.chapter}: {s.earned} of {s.possible} points"
    if verdict.outcome != JUDGED:
        output += f"\nno verdict ({verdict.outcome}): {verdict.reason}"
    return {
        "score": s.earned,
        "execution_time": int(round(verdict.wall_s)),
        "output": output,
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def write_gradescope(folder: Path, verdicts: Sequence[Verdict], points: Points) -> None:
    """`folder/<student>_<chapter>.json`, or the one results.json Gradescope reads when grading
    a single submission (`folder` then is /autograder/results)."""
    folder.mkdir(parents=True, exist_ok=True)
    if len(verdicts) == 1:
        (folder / "results.json").write_text(json.dumps(gradescope(verdicts[0], points), indent=1))
        return
    for v in verdicts:
        (folder / f"{v.student}_{v.chapter}.json").write_text(
            json.dumps(gradescope(v, points), indent=1)
        )


def write_junit(path: Path, verdicts: Sequence[Verdict], points: Points) -> None:
    suites = ET.Element("testsuites", name="minisgl workbook")
    for v in verdicts:
        failing = [e for e in v.exercises if e.status != PASSING or v.outcome != JUDGED]
        suite = ET.SubElement(
            suites, "testsuite", name=f"{v.student}.{v.chapter}", tests=str(len(v.exercises)),
            failures=str(len(failing)), errors="0", time=f"{v.wall_s:.2f}",
        )  # fmt: skip
        if v.outcome != JUDGED:
            ET.SubElement(suite, "system-err").text = f"{v.outcome}: {v.reason}"
        for e in v.exercises:
            case = ET.SubElement(
                suite, "testcase", classname=f"{v.student}.{v.chapter}", name=e.name, time="0"
            )
            if e.status != PASSING or v.outcome != JUDGED:
                failure = ET.SubElement(case, "failure", message=e.status, type=e.status)
                failure.text = "\n".join(e.failures) or (v.reason or e.status)
    ET.indent(suites)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
