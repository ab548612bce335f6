"""The milestones at the end of each part (classroom/milestone.py): the learner's engine so far,
swapped in with the judge's swap, on a real workload beside the reference; a wrong exercise named
in the judge's words, never a traceback."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from classroom import milestone
from classroom.tryout import FAIL, PASS

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"


def _run(capsys, part, notebooks=SOLUTIONS, variant=None):
    result = milestone.run(part, notebooks, variant)
    return result, capsys.readouterr().out


def _both_columns(out: str, result) -> None:
    assert "yours" in out and "reference" in out
    for name, value in result.reference.rows.items():
        line = next(ln for ln in out.splitlines() if ln.startswith(name))
        assert line.rstrip().endswith(value), line  # the reference's column always prints


@pytest.mark.parametrize("part", [1, 2])
def test_the_reference_solutions_run_as_the_reference_does(capsys, part):
    result, out = _run(capsys, part)
    assert result.stubs == [] and result.swapped  # every exercise came from the solutions
    assert result.same_as_reference, out
    _both_columns(out, result)
    assert f"{PASS} your engine's tokens and counts equal the reference's" in out
    assert FAIL not in out


# a server per column (part 3), two tensor-parallel ranks (part 4): CI's nbval runs them too
@pytest.mark.slow
@pytest.mark.parametrize("part", [3, 4])
def test_the_later_parts_run_as_the_reference_does(capsys, part):
    result, out = _run(capsys, part)
    assert result.same_as_reference, out
    _both_columns(out, result)


def test_a_wrong_count_with_right_tokens_names_the_exercise(capsys):
    # the budget let through one token too many: every token is right, the chunks are not
    result, out = _run(capsys, 2, variant="ch10_budget_off_by_one")
    _both_columns(out, result)
    assert f"{FAIL} the long prompt's prefill pieces: [33, 33, 33, 33, 33], the reference's" in out
    assert f"{FAIL} ch10.try_add_one, put in alone, changes the long prompt's prefill pieces" in out


def test_wrong_tokens_name_the_exercise(capsys):
    result, out = _run(capsys, 1, variant="ch06_top_p_before_top_k")
    _both_columns(out, result)
    assert f"{FAIL} the sampled batch's tokens: request 0's token" in out
    assert "ch06.top_k_top_p_filter, put in alone, changes the sampled batch's tokens" in out


def test_an_exercise_that_raises_is_named_with_its_line_not_a_traceback(capsys, tmp_path):
    notebooks = _solutions_with(tmp_path, "ch04.allocate", 'raise KeyError("no page left")')
    result, out = _run(capsys, 1, notebooks=notebooks)
    _both_columns(out, result)
    assert "Traceback" not in out
    culprit = next(ln for ln in out.splitlines() if ln.startswith(f"{FAIL} ch04.allocate raised"))
    assert "KeyError" in culprit and "in your code: ch04_kvcache.ipynb cell" in culprit
    assert 'raise KeyError("no page left")' in culprit


def test_stubs_are_left_to_the_reference_and_said(tmp_path):
    (tmp_path / "ch00_tiny_engine.ipynb").write_bytes(
        (REPO / "notebooks" / "ch00_tiny_engine.ipynb").read_bytes()
    )
    for path in sorted(SOLUTIONS.glob("ch0[1-6]_*.ipynb")):
        shutil.copyfile(path, tmp_path / path.name)
    _, _, swapped, stubs = milestone.learner_spec(1, tmp_path, None)
    assert stubs and all(s.startswith("ch00.") for s in stubs)
    assert swapped and not any(s.startswith("ch00.") for s in swapped)
    result = milestone.Result(1, milestone.Column(), milestone.Column(), swapped, stubs)
    assert f"still stubs, the reference runs in their place: {stubs[0]}" in milestone.render(result)


def test_no_such_part_or_variant_is_a_clear_error(tmp_path):
    with pytest.raises(milestone.MilestoneError, match="the milestones are parts 1, 2, 3, 4"):
        milestone.run(5)
    with pytest.raises(milestone.MilestoneError, match="no known-wrong variant ch09_nothing"):
        milestone.learner_spec(2, SOLUTIONS, "ch09_nothing")
    with pytest.raises(milestone.UnreadableNotebook, match="no notebook for ch00"):
        milestone.learner_spec(1, tmp_path, None)


def test_an_unreadable_notebook_is_said_and_the_reference_still_runs(capsys, tmp_path):
    for path in sorted(SOLUTIONS.glob("ch0[0-6]_*.ipynb")):
        shutil.copyfile(path, tmp_path / path.name)
    (tmp_path / "ch03_loading.ipynb").write_text('{"cells": [')  # saved half-way
    result, out = _run(capsys, 1, notebooks=tmp_path)
    _both_columns(out, result)
    assert f"{FAIL} only the reference ran: {tmp_path}/ch03_loading.ipynb is not a valid" in out
    assert "Traceback" not in out


def _solutions_with(tmp_path: Path, exercise: str, first_line: str) -> Path:
    """The solution notebooks of part 1, with `first_line` put first in `exercise`'s body."""
    for path in sorted(SOLUTIONS.glob("ch0[0-6]_*.ipynb")):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell.get("metadata", {}).get("minisgl", {}).get("exercise") == exercise:
                cell["source"] = _prepend(cell["source"], exercise.split(".")[1], first_line)
        (tmp_path / path.name).write_text(json.dumps(nb))
    return tmp_path


def _prepend(source, name: str, line: str) -> str:
    text = "".join(source) if isinstance(source, list) else source
    fn = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    lines = text.splitlines(keepends=True)
    first = fn.body[0]
    lines.insert(first.lineno - 1, " " * first.col_offset + line + "\n")
    return "".join(lines)


MILESTONES = sorted((REPO / "chapters").glob("ch??m_*.md"))


def test_each_part_has_its_milestone_right_after_its_last_chapter():
    from tools.workbook.commands import chapters

    order = [c.chapter for c in chapters()]
    assert [p.name[:5] for p in MILESTONES] == ["ch06m", "ch11m", "ch15m", "ch21m"]
    for part, last in milestone.PARTS.items():
        assert order[order.index(last) + 1] == last + "m"  # the site's navigation is this order


def test_a_milestone_notebook_runs_its_part_and_has_no_judge_cell():
    from tools.workbook import notebook
    from tools.workbook.source import read_chapter

    for part, path in enumerate(MILESTONES, start=1):
        ch = read_chapter(path)
        assert ch.is_milestone and not ch.exercises
        nb = notebook.render(ch, "learner")
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert f"milestone.run({part})" in code and "milestone.checklist(result)" in code
        assert "judge.check" not in code


def test_execute_fails_a_milestone_whose_solutions_run_is_not_the_reference(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from tools.workbook.commands import milestone_problems
    from tools.workbook.source import read_chapter

    ch = read_chapter(MILESTONES[0])

    def executed(text: str):
        cell = new_code_cell("milestone.run(1)")
        cell.outputs = [new_output("stream", name="stdout", text=text)]
        return nbformat.from_dict(new_notebook(cells=[cell]))

    assert milestone_problems(ch, executed(f"{PASS} your engine's tokens ...\n")) == []
    bad = milestone_problems(ch, executed(f"{FAIL} ch04.allocate raised KeyError\n"))
    assert bad and "ch04.allocate raised KeyError" in bad[0]


SERVER_LOG = """minisgl: serving shakespeare-qwen3 on http://127.0.0.1:40001
Traceback (most recent call last):
  File "/repo/minisgl/server/tokenize.py", line 88, in _detokenize
    text = next_text(state, ids)
  File "ch13_tokenizer_worker.ipynb cell 14 (ch13.next_text)", line 6, in next_text
    return window[start]
IndexError: list index out of range
"""


def test_a_server_that_fails_in_your_code_names_the_exercise_and_its_line():
    from classroom.milestone_worker import blame_from_error
    from classroom.milestone_workloads import _learner_lines
    from judge.protocol import ExerciseSpec, UnitSpec

    said = _learner_lines(SERVER_LOG)
    assert said == (
        "; ch13.next_text: raised IndexError: list index out of range in the server; in your "
        "code: ch13_tokenizer_worker.ipynb cell 14 (ch13.next_text), line 6, in next_text"
    )
    unit = UnitSpec("ch13", "notebook", "reference")
    unit.exercises = [
        ExerciseSpec("ch13.next_text", "next_text", "minisgl.server.detokenizer:next_text", True)
    ]
    error = "a request to your server failed: APITimeoutError: Request timed out." + said
    assert blame_from_error(None, error, [unit]) == [said[2:]]
    standin = "LearnerCodeError: ch13.next_text: your code failed to load: NameError"
    assert _learner_lines(SERVER_LOG + standin) == "; " + standin.split(": ", 1)[1]


def test_a_run_that_never_ends_is_stopped_and_said():
    import time

    from classroom.milestone_worker import in_child

    start = time.monotonic()
    got = in_child(lambda: time.sleep(60) or {}, timeout=1.0)
    assert time.monotonic() - start < 10
    assert got == {"error": "it did not finish in 1 s (a loop that never ends?)"}
    assert in_child(lambda: {"checks": {"x": [1]}}, timeout=30.0) == {"checks": {"x": [1]}}
    raised = in_child(lambda: {}["missing"], timeout=30.0)
    assert raised == {"error": "KeyError: 'missing'"}
