"""Hints live out of the list of exercises (judge/hints/chNN.toml beside the registry), so the file
a learner reads to see which functions to write gives none of their steps away; `--hint` still
shows them tier by tier, and a hint for no exercise, or one left in the registry, is refused."""

from __future__ import annotations

import pytest

from judge.cli import main
from judge.registry import DEFAULT_REGISTRY, RegistryError, load_registry
from judge_fixtures import fake_project, write_hints


def test_the_registry_a_learner_reads_holds_no_hint():
    assert "hints = [" not in DEFAULT_REGISTRY.read_text()
    registry = load_registry()
    without = [e.id for c in registry.chapters.values() for e in c.exercises if not e.hints]
    assert not without, f"exercises without hints in judge/hints/: {without}"


def test_hints_are_read_from_the_chapter_file_tier_by_tier(tmp_path, monkeypatch, capsys):
    fake_project(tmp_path, monkeypatch)
    assert load_registry().chapter("ch42").exercise("double").hints == (
        "first hint",
        "second hint",
        "third hint",
    )
    assert main(["ch42", "--hint", "--exercise", "double"]) == 0
    out = capsys.readouterr().out
    assert "first hint" in out and "second hint" not in out, out
    assert main(["ch42", "--hint", "2", "--exercise", "double"]) == 0
    out = capsys.readouterr().out
    assert "second hint" in out and "third hint" not in out, out


def test_a_hint_for_no_exercise_is_refused_by_name(tmp_path, monkeypatch):
    fake_project(tmp_path, monkeypatch)
    write_hints(tmp_path, "ch42", {"doubel": ["a typo'd name"]})
    with pytest.raises(RegistryError, match="`doubel` is not an exercise of \\[ch42\\]"):
        load_registry()


def test_a_hint_left_in_the_registry_says_where_it_goes(tmp_path, monkeypatch):
    project = fake_project(tmp_path, monkeypatch)
    path = project.root / "registry.toml"
    path.write_text(
        path.read_text().replace(
            'target = "fakepkg.mod:double"', 'target = "fakepkg.mod:double"\nhints = ["x"]'
        )
    )
    with pytest.raises(RegistryError, match="hints go in .*ch42.toml"):
        load_registry()
