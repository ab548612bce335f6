"""`python -m tools.workbook learner --jobs N` (tools/workbook/by_chapter.py): chapters in their own
processes N at a time, the longest first, each chapter's output whole, any failure failing the
command."""

from __future__ import annotations

import json
import subprocess
import time
from types import SimpleNamespace

import pytest

from tools.workbook import by_chapter, commands


@pytest.fixture
def three(tmp_path):
    """Three chapters whose solutions say they ran 1, 30 and 5 s."""
    chs = []
    for cid, seconds in [("ch01", 1), ("ch02", 30), ("ch03", 5)]:
        ch = SimpleNamespace(chapter=cid, stem=f"{cid}_x")  # all by_chapter reads of a Chapter
        (tmp_path / f"{cid}.ipynb").write_text(
            json.dumps({"metadata": {"minisgl": {"execution": {"seconds": seconds}}}})
        )
        chs.append(ch)
    return chs, (lambda ch: tmp_path / f"{ch.chapter}.ipynb")


def fake_run(fails=(), seconds=0.0, started=None):
    def run(argv, **kwargs):
        cid = argv[-1]
        if started is not None:
            started.append(cid)
        lines = "".join(f"{cid} line {i}\n" for i in range(3))
        time.sleep(seconds)
        return subprocess.CompletedProcess(argv, 1 if cid in fails else 0, stdout=lines)

    return run


def test_the_longest_chapter_starts_first_and_each_output_comes_whole(three, monkeypatch, capsys):
    chs, solution = three
    started = []
    monkeypatch.setattr(by_chapter.subprocess, "run", fake_run(seconds=0.2, started=started))
    assert by_chapter.run("learner", chs, 3, solution) == 0
    assert started[0] == "ch02", f"started in the order {started}, not the longest first"
    out = capsys.readouterr().out.splitlines()
    for cid in ("ch01", "ch02", "ch03"):
        at = out.index(f"{cid} line 0")
        assert out[at : at + 3] == [f"{cid} line {i}" for i in range(3)], out


def test_a_failed_chapter_fails_the_command_naming_it(three, monkeypatch, capsys):
    chs, solution = three
    monkeypatch.setattr(by_chapter.subprocess, "run", fake_run(fails={"ch03"}))
    assert by_chapter.run("learner", chs, 2, solution) == 1
    assert "FAIL ch03_x: `learner ch03` exited 1" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--jobs"], ["--jobs", "0"], ["--jobs", "two"]])
def test_jobs_without_a_count_of_one_or_more_is_refused(args):
    with pytest.raises(SystemExit, match="--jobs needs a number"):
        commands._jobs_option(["ch01", *args])


def test_jobs_is_taken_out_of_the_chapter_ids():
    assert commands._jobs_option(["ch01", "--jobs", "3", "ch02"]) == (["ch01", "ch02"], 3)
    assert commands._jobs_option(["ch01"]) == (["ch01"], 1)
