"""The GitHub Classroom workflow run as a student's repository would run it: its grading steps'
commands, in order, on a student's ch01 notebook, scored as GitHub Classroom's reporter scores
them (a step's max-score when its command exits 0). Plus the Docker image, where Docker works."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers import test_device
from judge.grading import classroom
from judge.grading.points import Points
from tests import grading_class

REPO = grading_class.REPO
GRADER = "classroom-resources/autograding-command-grader@v1"
REPORTER = "classroom-resources/autograding-grading-reporter@v1"


def _steps(chapters):
    text = classroom.render(chapters, Points(1.0, {"ch01.complete_one": 2.0}))
    flow = yaml.safe_load(text)
    assert flow["on"] == ["push", "workflow_dispatch", "repository_dispatch"]
    return flow["jobs"]["run-autograding-tests"]["steps"]


def test_every_grading_step_reaches_the_reporter():
    steps = _steps(["ch00", "ch01"])
    graders = [s for s in steps if s.get("uses") == GRADER]
    (reporter,) = [s for s in steps if s.get("uses") == REPORTER]
    assert steps[-1] is reporter
    assert [s["uses"] for s in steps[:2]] == ["actions/checkout@v4", "actions/setup-python@v5"]
    ids = [s["id"] for s in graders]
    assert reporter["with"]["runners"].split(",") == ids and len(set(ids)) == len(ids) == 8
    for step in graders:
        expected = f"${{{{steps.{step['id']}.outputs.result}}}}"
        assert reporter["env"][f"{step['id'].upper()}_RESULTS"] == expected
    worth = {s["with"]["test-name"]: s["with"]["max-score"] for s in graders}
    assert worth["ch01.complete_one"] == 2 and worth["ch00.rms_norm"] == 1


@pytest.mark.skipif(test_device() == "cuda", reason="the grader runs on the CPU: tested there")
def test_the_steps_judge_a_students_notebook(tmp_path):
    """A student whose complete_one is wrong: 3 of ch01's 5 points (complete_one is worth 2), as
    `judge.py grade` scores it. The judge runs from the checkout, in a folder of its own (the
    runner's workspace), on the student's notebook."""
    student = tmp_path / "notebooks"
    student.mkdir()
    ((exercise, code),) = grading_class.variants()["ch01_cached_plus_one"].items()
    (student / "ch01_core.ipynb").write_text(json.dumps(grading_class.notebook({exercise: code})))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MINISGL_JUDGE_NOTEBOOKS": str(student),  # the student's repository's notebooks/
        "MINISGL_JUDGE_PROGRESS": str(tmp_path / "progress.json"),
    }
    scores = {}
    for step in _steps(["ch01"]):
        if "run" in step and "judge.py" in step["run"]:  # the chapter's judging, run by a shell
            judged = subprocess.run(
                step["run"].replace("python judge.py", f"{sys.executable} {REPO / 'judge.py'}"),
                shell=True, cwd=tmp_path,
                env={**env, "PATH": os.environ["PATH"]}, timeout=60 * step["timeout-minutes"],
            )  # fmt: skip
            assert judged.returncode == 0
        if step.get("uses") != GRADER:
            continue
        args = shlex.split(step["with"]["command"])
        assert args[0] == "python"
        done = subprocess.run(
            [sys.executable, *args[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60 * step["with"]["timeout"],
        )  # fmt: skip
        scores[step["with"]["test-name"]] = step["with"]["max-score"] if done.returncode == 0 else 0
    assert scores == {
        "ch01.complete_one": 0,
        "ch01.extend_len": 1,
        "ch01.can_decode": 1,
        "ch01.is_greedy": 1,
    }


def _docker_works() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _docker_works(), reason="no Docker daemon: run tools/grader_image.sh")
def test_grader_image_builds_and_grades(tmp_path):
    done = subprocess.run(
        ["bash", str(REPO / "tools" / "grader_image.sh"), str(tmp_path)],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    grades = json.loads((tmp_path / "grades" / "grades.json").read_text())
    assert {s["student"]: s["score"] for s in grades["submissions"]}["solution_00"] == 4
