"""The judge on a real chapter: chapter 1's exercises swapped into minisgl (properties and a method
of
`Req` and `SamplingParams`), judged by the real chapter-1 tests in a subprocess."""

from __future__ import annotations

import json

from judge.cli import main

LEARNER = """
def complete_one(self):
    self.cached_len += 1  # wrong after a prefill: the whole prompt is cached, not one token
    self.device_len += 1


def extend_len(self):
    return self.device_len - self.cached_len


@property  # accepted too: the judge re-applies the target's kind either way
def can_decode(self):
    return self.remain_len > 0


def is_greedy(self):
    return self.temperature == 0.0 or self.top_k == 1
"""


def test_chapter_1_with_one_wrong_method(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINISGL_JUDGE_PROGRESS", str(tmp_path / "progress.json"))
    mine = tmp_path / "mine.py"
    mine.write_text(LEARNER)
    assert main(["ch01", "--file", str(mine), "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    failed = {t["test"].split("::")[-1] for t in verdict["tests"] if t["outcome"] != "passed"}
    assert failed and all("complete_one" in t or "prefill" in t for t in failed), failed
    assert len(verdict["tests"]) > 20  # the other tests ran, with the learner's properties in place
    status = {e["name"]: e["status"] for e in verdict["exercises"]}
    assert status["complete_one"] == "failing"
