"""The mutation-testing tool (tools/mutants): which mistakes it makes, and how it judges them, on
the judge's fake chapter (judge_fixtures.py), where a run takes a fraction of a second."""

from __future__ import annotations

import pytest

from judge_fixtures import fake_project
from tools.mutants.__main__ import main
from tools.mutants.operators import mutants

SOURCE = '''\
def f(self, xs, n):
    """Doc."""
    total = 0
    for x in xs[:n]:
        if x < 0 and self.strict:
            break
        total += x
    self.record(total, keepdim=True)
    return torch.zeros(len(xs), dtype=torch.float32) + max(total, n) * 2
'''


def test_every_class_of_mistake_is_made_once_and_compiles():
    ms = mutants(SOURCE, "f")
    assert {m.op for m in ms} == {
        "arith",
        "compare",
        "logic",
        "negate",
        "const",
        "length",
        "dtype",
        "kwarg",
        "args",
        "call",
        "drop",
        "swap",
        "flow",
    }, "an operator class made no mutant"
    assert len({m.source for m in ms}) == len(ms), "two mutants are the same code"
    for m in ms:
        compile(m.source, m.id, "exec")
    described = {m.description for m in ms}
    assert "line 5: x < 0 -> x <= 0" in described
    assert "line 8: self.record(total, keepdim=True) -> self.record(total)" in described
    assert "line 6: break -> continue" in described


def test_a_mutant_id_survives_an_edit_of_the_docstring():
    ids = [m.id for m in mutants(SOURCE, "f")]
    edited = SOURCE.replace(
        '"""Doc."""', '"""A longer contract: what f receives and leaves behind."""'
    )
    assert [m.id for m in mutants(edited, "f")] == ids


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_MUTANTS_RESULTS", str(tmp_path / "results"))
    return fake_project(tmp_path, monkeypatch)


def test_strong_tests_kill_every_mutant(project, capsys):
    assert main(["ch42", "--exercise", "double", "--workers", "1"]) == 0
    assert "ch42.double: 100.0 % killed" in capsys.readouterr().out


def test_a_weak_test_lets_mutants_survive_until_they_are_killed_or_recorded(project, capsys):
    # test_is_big checks 11 and 0 only: `> 10` -> `>= 10` and `10` -> `9` survive.
    assert main(["ch42", "--exercise", "is_big", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    survivors = [
        line.split()[1] for line in out.splitlines() if line.strip().startswith("survived ")
    ]
    assert len(survivors) == 2, out
    assert "self.n > 10 -> self.n >= 10" in out

    registry = project.root / "registry.toml"
    text = registry.read_text().replace(
        'tests = ["test_fake.py::test_is_big"]',
        'tests = ["test_fake.py::test_is_big"]\nequivalent_mutants = [\n'
        + "".join(f'  {{ id = "{s}", why = "recorded for the test" }},\n' for s in survivors)
        + "]",
    )
    registry.write_text(text)
    assert main(["ch42", "--exercise", "is_big", "--workers", "1"]) == 0
    assert "2 equivalent" in capsys.readouterr().out

    registry.write_text(text.replace(survivors[0], "compare-00000000"))
    assert main(["ch42", "--exercise", "is_big", "--workers", "1"]) == 1, (
        "a stale equivalent must fail"
    )
    out = capsys.readouterr().out
    assert "stale: compare-00000000" in out and "survived" in out


def test_the_ci_sample_fails_on_a_survivor(project, capsys):
    assert main(["ch42", "--exercise", "double", "--sample", "3", "--check", "--workers", "1"]) == 0
    assert (
        main(["ch42", "--exercise", "is_big", "--sample", "20", "--check", "--workers", "1"]) == 1
    )
    assert "survived" in capsys.readouterr().out


def test_markdown_table_from_the_last_runs(project, capsys):
    main(["ch42", "--exercise", "double", "--workers", "1"])
    capsys.readouterr()
    assert main(["ch42", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert "| ch42.double |" in table and "100.0 %" in table and "| ch42.bump | not run |" in table
