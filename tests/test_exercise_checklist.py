"""Every registered exercise has what judge/README.md's "Adding an exercise" lists beyond its
registry entry: tests that exist, a known-wrong variant (or the reason for none), CPU budgets for
its tests, a try-out check in its chapter, a row in chapters/README.md's try-out table
(tools/exercise_checklist.py reads them from the files; nothing is run)."""

from __future__ import annotations

import json

import pytest

from judge.registry import load_registry
from judge_fixtures import fake_project
from tools.exercise_checklist import BUDGET, TABLE, TESTS, TRYOUT, VARIANT, Layout, missing, report

# Exercises registered before the checklist, with what each still lacks. The list may only shrink:
# a new exercise must have everything, and an entry that is no longer lacking must go.
OWED: dict = {}  # every exercise has what the checklist asks; keep it empty


def test_every_exercise_has_its_tests_variant_budgets_tryout_and_table_row():
    registry = load_registry()
    gaps = {}
    for chapter in registry.chapters.values():
        gaps.update(missing(chapter))
    new = {
        ex: [(kind, text) for kind, text in lacks if kind not in OWED.get(ex, ())]
        for ex, lacks in gaps.items()
    }
    new = {ex: lacks for ex, lacks in new.items() if lacks}
    assert not new, "exercises lack what judge/README.md's 'Adding an exercise' lists:\n" + report(
        new
    )
    settled = [
        f"{ex}: {kind}"
        for ex, kinds in OWED.items()
        for kind in kinds
        if kind not in {k for k, _ in gaps.get(ex, [])}
    ]
    assert not settled, "no longer lacking, drop from OWED: " + ", ".join(settled)


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """ch42 of the fake project, registered with its tests and nothing else."""
    fake_project(tmp_path, monkeypatch)
    (tmp_path / "chapters").mkdir()
    (tmp_path / "budgets.json").write_text(json.dumps({"times": {"cpu": {}}}))
    (tmp_path / "chapters" / "README.md").write_text("# Chapter sources\n")
    layout = Layout(
        budgets=tmp_path / "budgets.json",
        chapters=tmp_path / "chapters",
        table=tmp_path / "chapters" / "README.md",
    )
    return tmp_path, layout


def test_an_exercise_without_its_files_is_named_with_each_thing_it_lacks(bare):
    tmp_path, layout = bare
    chapter = load_registry().chapter("ch42")
    lacks = missing(chapter, layout)["ch42.double"]
    assert [kind for kind, _ in lacks] == [VARIANT, BUDGET, TRYOUT, TABLE], lacks
    text = report({"ch42.double": lacks})
    for words in ("judge/variants/ch42_<mistake>.diff editing `double`", "a CPU budget for 3",
                  "{exercise} ch42.double cell", "a row for double under ch42"):  # fmt: skip
        assert words in text, f"the message does not say {words!r}: {text}"

    (tmp_path / "variants" / "ch42_off_by_one.diff").write_text(
        "Adds one.\n\n@@ double\n-    return x * SCALE\n+    return x * SCALE + 1\n"
    )
    times = {t: 0.1 for t in chapter.exercise("double").tests}
    (tmp_path / "budgets.json").write_text(json.dumps({"times": {"cpu": times}}))
    (tmp_path / "chapters" / "ch42_fake.md").write_text(
        "```{exercise} ch42.double\nwith attempt('ch42.double'):\n    print(double(2))\n```\n"
    )
    lacks = missing(chapter, layout)["ch42.double"]
    assert [kind for kind, _ in lacks] == [TRYOUT, TABLE], lacks  # the try-out checks nothing

    (tmp_path / "chapters" / "ch42_fake.md").write_text(
        "```{exercise} ch42.double\ncheck('doubles', double(2) == 4, double(2))\n```\n"
    )
    (tmp_path / "chapters" / "README.md").write_text(
        "###### Chapter 42 (ch42)\n\n| exercise | checks |\n| --- | --- |\n| double | doubles |\n"
    )
    assert "ch42.double" not in missing(chapter, layout)


def test_a_test_the_registry_names_must_exist(bare, tmp_path):
    registry = tmp_path / "registry.toml"
    registry.write_text(
        registry.read_text().replace('"test_fake.py::test_bump"', '"test_fake.py::test_bumps"')
    )
    lacks = missing(load_registry().chapter("ch42"), bare[1])["ch42.bump"]
    assert (TESTS, "its test test_fake.py::test_bumps (no such test function in the chapter's "
            "test files)") in lacks, lacks  # fmt: skip
