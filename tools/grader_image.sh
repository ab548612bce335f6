#!/usr/bin/env bash
# Build the grader's image (Dockerfile) and grade a sample ch01 class in it: the check a teacher
# runs where Docker works (the tests build it only when `docker info` answers).
#   tools/grader_image.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
docker build -t minisgl-grader .
python -m tests.grading_class "$work/class" --copies 14
rm "$work/class/expected.json"
mkdir -p "$work/grades"
docker run --rm --network none --cap-add SYS_ADMIN --security-opt seccomp=unconfined \
    -v "$work/class:/class:ro" -v "$work/grades:/grades" \
    minisgl-grader grade ch01 /class --out /grades --wall-s 120
python - "$work" <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
grades = json.loads((work / "grades" / "grades.json").read_text())
for s in grades["submissions"]:
    print(f"{s['student']:24} {s['outcome']:10} {s['score']}/{s['max_score']}")
PY
echo "reports in $work/grades"
