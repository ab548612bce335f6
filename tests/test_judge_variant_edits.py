"""Known-wrong variants as edits of the reference (judge/variant_edits.py): an edit is built from
the reference as it is now, and one that no longer applies exactly, or that changes nothing the
function does, is refused naming the variant, by the self-check too. A fake chapter
(tests/judge_fixtures.py) whose reference is `def double(x): return x * SCALE`."""

from __future__ import annotations

import pytest

from judge.cli import main
from judge.variant_edits import VariantError, read_variant, variant_source
from judge_fixtures import fake_project

TRIPLE = "Triples instead of doubling.\n\n@@ double\n-    return x * SCALE\n+    return 3 * x\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    return fake_project(tmp_path, monkeypatch)


def test_an_edit_is_applied_to_the_current_reference(project):
    path = project.variants / "ch42_triple.diff"
    path.write_text(TRIPLE)
    source = variant_source(path)
    assert "    return 3 * x\n" in source and "x * SCALE" not in source
    assert '"""Return x times SCALE."""' in source  # the rest is the reference's, docstring too
    assert read_variant(path).summary() == "Triples instead of doubling."


def test_a_reference_change_that_breaks_an_edit_fails_the_selfcheck_naming_it(project, capsys):
    (project.variants / "ch42_triple.diff").write_text(TRIPLE)
    assert main(["--selfcheck", "ch42"]) == 0
    capsys.readouterr()
    module = project.root / "fakepkg" / "mod.py"
    module.write_text(module.read_text().replace("return x * SCALE", "return SCALE * x"))
    assert main(["--selfcheck", "ch42"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL ch42 variant triple" in out
    assert "variant ch42_triple, hunk `@@ double` (line 3): its lines are not found" in out
    assert "selfcheck FAILED" in out


def test_an_edit_found_twice_is_refused_and_context_makes_it_one(project):
    module = project.root / "fakepkg" / "mod.py"
    twice = "    x = x * 1\n    x = x * 1\n    return x * SCALE"
    module.write_text(module.read_text().replace("    return x * SCALE", twice))
    path = project.variants / "ch42_twice.diff"
    path.write_text("Triples.\n\n@@ double\n-    x = x * 1\n+    x = x * 3\n")
    with pytest.raises(VariantError, match=r"ch42_twice, hunk .*: its lines are found 2 times"):
        variant_source(path)
    context = "     x = x * 1\n-    x = x * 1\n+    x = x * 3\n     return x * SCALE\n"
    path.write_text("Triples.\n\n@@ double\n" + context)
    assert "    x = x * 1\n    x = x * 3\n    return x * SCALE\n" in variant_source(path)


def test_an_edit_that_changes_nothing_is_refused(project, capsys):
    path = project.variants / "ch42_same.diff"
    path.write_text(
        "Only a comment.\n\n@@ double\n-    return x * SCALE\n+    return x * SCALE  # a note\n"
    )
    with pytest.raises(VariantError, match="ch42_same: its hunks leave double as the reference"):
        variant_source(path)
    path.write_text("Nothing at all.\n\n@@ double\n     return x * SCALE\n")
    with pytest.raises(VariantError, match=r"hunk `@@ double` \(line 3\): it changes nothing"):
        variant_source(path)
    assert main(["--selfcheck", "ch42"]) == 1
    assert "FAIL ch42 variant same" in " ".join(capsys.readouterr().out.split())


def test_a_whole_variant_says_why_and_others_are_refused_plainly(project):
    whole = project.variants / "ch42_whole.py"
    whole.write_text('"""Triples."""\n\n\ndef double(x):\n    return 3 * x\n')
    with pytest.raises(VariantError, match="# whole function: <why>"):
        variant_source(whole)
    whole.write_text('"""Triples."""\n# whole function: not like the reference\n\ndef double(x):\n')
    whole.write_text(whole.read_text() + "    return 3 * x\n")
    assert variant_source(whole) == whole.read_text()  # as it is
    bad = project.variants / "ch42_bad.diff"
    bad.write_text("No such exercise.\n\n@@ triple\n-    return x * SCALE\n+    return 3 * x\n")
    with pytest.raises(VariantError, match="ch42 has no exercise triple"):
        variant_source(bad)
    bad.write_text("@@ double\n-    return x * SCALE\n+    return 3 * x\n")
    with pytest.raises(VariantError, match="no description"):
        variant_source(bad)
    bad.write_text("Odd line.\n\n@@ double\n*    return x * SCALE\n")
    with pytest.raises(VariantError, match="line 4: a hunk line starts with"):
        variant_source(bad)
