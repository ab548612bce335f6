"""`python judge.py grade` on a real class of ch01 notebooks (tests/grading_class.py): solutions,
the stub, the known-wrong variants, and hostile submissions, judged two at a time in the sandbox
with small limits. Every verdict must be right and each attack must cost only its own verdict.
About two minutes on two busy cores as root (a pids cgroup stops the fork bomb); about four
without one (the fork bomb then spends its whole wall-time limit)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import test_device
from judge.grading.isolate import REPO, probe
from tests import grading_class

CONTAINMENT = probe()
pytestmark = [
    pytest.mark.skipif(
        not CONTAINMENT.namespaces,
        reason="unshare's namespaces are refused here: the sandbox would be limits only",
    ),
    # the grader judges on the CPU whatever the machine: the GPU run adds nothing but a sandbox
    # in another kernel (seen on the H100's, every submission 'ended abruptly while loading')
    pytest.mark.skipif(test_device() == "cuda", reason="the grader runs on the CPU: tested there"),
]
SECRET = "GRADING_TEACHER_SECRET"  # a variable of the teacher's, not of the engine


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("grading")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    expected = grading_class.write_class(root / "class", copies=14, port=port, secret=SECRET)
    (root / "class" / "expected.json").unlink()  # not a submission
    judge_before = _digest(REPO / "judge")
    command = [
        sys.executable, str(REPO / "judge.py"), "grade", "ch01", str(root / "class"),
        "--out", str(root / "out"), "--jobs", "2",
        "--wall-s", "100", "--processes", "48", "--memory-mb", "3072", "--file-mb", "16",
    ]  # fmt: skip
    env = {**os.environ, SECRET: "the teacher's token", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    listener.close()
    grades = json.loads((root / "out" / "grades.json").read_text())
    return {
        "expected": expected,
        "done": done,
        "root": root,
        "verdicts": {s["student"]: s for s in grades["submissions"]},
        "judge_changed": _digest(REPO / "judge") != judge_before,
        "command": command,
        "env": env,
    }


def test_every_verdict_is_right(graded):
    assert graded["done"].returncode == 0, graded["done"].stderr[-3000:]
    assert sorted(graded["verdicts"]) == sorted(graded["expected"])
    grades = {"submissions": list(graded["verdicts"].values())}
    assert not grading_class.wrong_verdicts(graded["expected"], grades)


def test_each_attack_is_named_in_its_own_verdict(graded):
    v = graded["verdicts"]

    def lines(student):
        return " ".join(f for e in v[student]["exercises"] for f in e["failures"])

    got = re.search(r"MemoryError: refused after (\d+) MiB", lines("allocation_loop"))
    assert got and int(got.group(1)) < 3072, lines("allocation_loop")  # the --memory-mb limit
    assert "File too large" in lines("huge_file")
    assert "Read-only file system" in lines("writes_the_judge") and not graded["judge_changed"]
    assert "No such file or directory" in lines("reads_a_neighbour")
    assert "Network is unreachable" in lines("opens_a_socket")
    assert SECRET in lines("reads_the_environment")  # KeyError: the variable is not there
    for student in ("fork_bomb", "kills_its_parent", "kills_its_grandparent"):
        assert v[student]["score"] == 0 if v[student]["outcome"] != "judged" else 3
    if CONTAINMENT.pids_cgroup is not None:  # seen within seconds, not at the wall-time limit
        assert v["fork_bomb"]["outcome"] == "crashed"
        assert "stopped at the process limit, 48 processes" in v["fork_bomb"]["reason"]
        assert v["fork_bomb"]["wall_s"] < 60
    elif v["fork_bomb"]["outcome"] == "timed out":
        assert "wall-time limit, 100 s" in v["fork_bomb"]["reason"]
    else:  # the judge stopped the loop of forks itself: its failing lines say how
        assert lines("fork_bomb")
    # The kill lands on the fork server (the shares' test processes die with it, their results
    # void), or, if a share started afresh after it, on the judge itself: no verdict.
    reason = v["kills_its_parent"]["reason"]
    assert "fork server was killed" in reason or "judge died without a verdict" in reason
    # the judge is the namespace's init's child, so the kill is not dropped as one sent to an init
    grandparent = v["kills_its_grandparent"]
    assert grandparent["outcome"] == "crashed", grandparent
    assert "the judge died without a verdict (killed by SIGKILL)" in grandparent["reason"]
    assert "ended abruptly (exit status 0" in lines("exits_in_a_test")
    assert "ended abruptly (exit status" in lines("closes_its_files")  # no events after it
    loading = v["exits_while_loading"]
    assert "exit status 0: os._exit() or a crash) while loading" in " ".join(loading["general"])
    assert "time budget" in lines("endless_loop")
    assert v["tryout_loop"]["score"] == v["solution_00"]["score"] == 4


def test_fork_bomb_leaves_no_process_or_cgroup(graded):
    root = CONTAINMENT.pids_cgroup
    if root is not None:
        assert not [p.name for p in root.glob("minisgl-grade-*")]
    spinning = subprocess.run(
        ["pgrep", "-f", "notebook /tmp/work/submission.ipynb"], capture_output=True, text=True
    )
    assert spinning.stdout == ""


def test_grading_again_takes_every_verdict_from_the_cache(graded):
    again = subprocess.run(
        graded["command"], env=graded["env"], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{len(graded['expected'])} from the cache" in " ".join(again.stderr.split())
    grades = json.loads((graded["root"] / "out" / "grades.json").read_text())
    assert all(s["cached"] for s in grades["submissions"])
