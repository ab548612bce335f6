"""One exercise's status from a saved verdict, as an exit code: what each GitHub Classroom
grading step runs, so that a step earns its points exactly when `judge.py grade` would give them.

    python judge.py ch01 --json > judged-ch01.json   # once per chapter (any exit status)
    python -m judge.grading.status judged-ch01.json ch01.complete_one

Exit 0 when the exercise is "passing", 1 when it is not (its status and failing lines are
printed), 2 when the verdict is missing or unreadable (the judge died: no points).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m judge.grading.status", description=__doc__)
    p.add_argument("verdict", type=Path, help="the output of `python judge.py chNN --json`")
    p.add_argument("exercise", help="chNN.name")
    args = p.parse_args(argv)
    try:
        data = json.loads(args.verdict.read_text())
        exercises = {e["id"]: e for e in data["exercises"]}
        tests = {t["test"]: t for t in data.get("tests", [])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"no verdict in {args.verdict} ({type(e).__name__}: {e}): the judge did not finish")
        return 2
    if args.exercise not in exercises:
        print(f"{args.exercise}: not in this verdict (its exercises: {', '.join(exercises)})")
        return 2
    ex = exercises[args.exercise]
    print(f"{ex['id']}: {ex['status']} ({ex['passed']} of {ex['total']} tests)")
    for test_id in ex.get("tests", []):
        t = tests.get(test_id)
        if t and t["outcome"] != "passed" and t.get("message"):
            print(f"  {test_id.split('::')[-1]}: {t['message']}")
    return 0 if ex["status"] == "passing" else 1


if __name__ == "__main__":
    sys.exit(main())
