"""The learner check's use of the mutation tool's sample (tools/workbook/mutant_tryouts.py): only
mutants the judge killed are tried, a sample of an older reference is refused, and a try-out under
90 % is reported with the mutants it missed."""

from __future__ import annotations

import json

import pytest

from judge.registry import load_registry
from judge.stubs import reference_source
from tools.mutants.operators import mutants
from tools.workbook.mutant_tryouts import killed_sample, share_line


@pytest.fixture
def exercise(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_MUTANTS_RESULTS", str(tmp_path))
    (tmp_path / "sample").mkdir()
    return load_registry().chapter("ch07").exercise("filter_reqs")


def _record(tmp_path, ex, results):
    path = tmp_path / "sample" / f"{ex.id}.json"
    path.write_text(json.dumps({"results": results}))


def test_no_sample_names_the_command_that_makes_one(exercise):
    got = killed_sample("ch07", exercise)
    assert not got.mutants
    assert "python -m tools.mutants ch07 --sample 5" in got.missing


def test_only_the_killed_mutants_are_tried(exercise, tmp_path):
    made = mutants(reference_source("ch07", exercise), exercise.attr)[:4]
    statuses = ["killed", "survived", "timeout", "killed"]
    _record(
        tmp_path,
        exercise,
        [{"id": m.id, "status": s, "by": "test_x: boom"} for m, s in zip(made, statuses)],
    )
    got = killed_sample("ch07", exercise)
    assert not got.missing
    assert [m.id for m in got.mutants] == [made[0].id, made[3].id]
    assert got.mutants[0].source == made[0].source


def test_a_sample_of_another_reference_is_refused(exercise, tmp_path):
    _record(tmp_path, exercise, [{"id": "drop-00000000", "status": "killed", "by": ""}])
    got = killed_sample("ch07", exercise)
    assert not got.mutants
    assert "drop-00000000" in got.missing and "again" in got.missing


def test_a_try_out_that_misses_one_of_five_is_under_the_target(exercise):
    made = mutants(reference_source("ch07", exercise), exercise.attr)[:5]
    ok, line = share_line("ch07.filter_reqs", made[:4], made[4:])
    assert not ok
    assert "flags 4 of the 5" in line and "(80 %)" in line and made[4].id in line
    assert share_line("ch07.filter_reqs", made, [])[0]
