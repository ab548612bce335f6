"""The workbook tool (tools/workbook): reading chapter sources, rendering the two notebooks and the
site page, and the rule that a learner notebook may fail only in its exercise cells.

These run on small chapters written here; nothing is executed in a kernel and torch is not
needed."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

nbformat = pytest.importorskip(
    "nbformat", reason="the workbook extra (pip install -e '.[workbook]')"
)
from nbformat.v4 import new_output  # noqa: E402

# `tools` is not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.workbook import commands, listing, notebook, site  # noqa: E402
from tools.workbook.source import (  # noqa: E402
    CodeCell,
    Exercise,
    Listing,
    Markdown,
    SourceError,  # noqa: E402
    read_chapter,
)

FRONT = """---
minisgl:
  chapter: ch11
  title: A test chapter
---
"""

BODY = """
# Title

Some prose with an example that is not a cell:

````markdown
```{code-cell} ipython3
print("inside a fence: text")
```
````

```{code-cell} ipython3
:tags: [nbval-check-output]
x = 1
print(x)
```
+++
More prose.

```{listing} minisgl.core:Req.complete_one
```

```{exercise} ch11.abort
print("try it")
```
"""


def write(tmp_path: Path, body: str, name: str = "ch11_test.md") -> Path:
    path = tmp_path / name
    path.write_text(FRONT + textwrap.dedent(body))
    return path


def test_blocks_are_read_in_order(tmp_path):
    ch = read_chapter(write(tmp_path, BODY))
    kinds = [type(b) for b in ch.blocks]
    assert kinds == [Markdown, CodeCell, Markdown, Listing, Exercise]
    assert "inside a fence" in ch.blocks[0].text  # a nested fence stays text
    assert ch.blocks[1].tags == ["nbval-check-output"] and ch.blocks[1].source == "x = 1\nprint(x)"
    assert ch.blocks[3].target == "minisgl.core:Req.complete_one"
    assert (ch.blocks[4].key, ch.blocks[4].tryout) == ("ch11.abort", 'print("try it")')
    assert ch.title == "A test chapter" and ch.stem == "ch11_test"


@pytest.mark.parametrize(
    "body,message",
    [
        ("```{exercise} ch07.normal_loop\n```\n", "another chapter"),
        ("```{figure} x.png\n```\n", "unknown directive"),
        ("```{code-cell} ipython3\nx = 1\n", "never closed"),
        ("```{listing} minisgl.core:Req.complete_one\nprint(1)\n```\n", "takes no body"),
        ("```{code-cell} ipython3\n:caption: nope\nx = 1\n```\n", "does not take option"),
    ],
)
def test_malformed_sources_say_where(tmp_path, body, message):
    with pytest.raises(SourceError, match=message):
        read_chapter(write(tmp_path, body))


def test_file_name_and_front_matter_must_agree(tmp_path):
    with pytest.raises(SourceError, match="file name"):
        read_chapter(write(tmp_path, "text\n", name="ch07_x.md"))


def test_listing_reads_real_code_without_importing():
    code = listing.resolve("minisgl.scheduler.scheduler:Scheduler.step")
    assert code.path == "minisgl/scheduler/scheduler.py"
    assert code.source.startswith("@torch.inference_mode()\ndef step(self)")  # decorators kept
    assert listing.resolve("tests/test_ch11_overlap.py::watch_slot_reuse").source.startswith(
        "def watch_slot_reuse("
    )
    with pytest.raises(listing.ListingError, match="not defined"):
        listing.resolve("minisgl.core:Req.no_such_method")


def test_learner_and_solution_notebooks(tmp_path):
    from judge.stubs import reference_source, stub_source

    ch = read_chapter(write(tmp_path, BODY))
    learner, solution = notebook.render(ch, "learner"), notebook.render(ch, "solution")
    assert [c.cell_type for c in learner.cells] == [c.cell_type for c in solution.cells]
    assert [c.id for c in learner.cells] == [c.id for c in solution.cells]
    ex = [c for c in learner.cells if "exercise" in c.metadata.get("tags", [])]
    assert len(ex) == 1 and ex[0].metadata["minisgl"] == {"exercise": "ch11.abort"}
    assert ex[0].source == stub_source("ch11", "abort").rstrip() + "\n\n\n" + 'print("try it")'
    ref = next(c for c in solution.cells if notebook.cell_kind(c) == "exercise")
    assert ref.source.startswith(reference_source("ch11", "abort").rstrip())
    # every notebook ends judged
    assert learner.cells[-1].source == 'import judge\n\njudge.check("ch11")'
    nbformat.validate(learner)
    # deterministic
    assert notebook.dumps(learner) == notebook.dumps(notebook.render(ch, "learner"))


def _executed(ch, outputs_by_kind):
    nb = notebook.render(ch, "learner")
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = outputs_by_kind.get(notebook.cell_kind(cell), [])
    return nb


def _error(name, value):
    return new_output("error", ename=name, evalue=value, traceback=[])


def test_a_learner_notebook_must_run_to_the_end_without_an_error(tmp_path):
    ch = read_chapter(write(tmp_path, BODY))
    assert commands.student_errors(ch, _executed(ch, {})) == []
    stub = _error("NotImplementedError", "ch11.abort: write Scheduler._abort")
    (problem,) = commands.student_errors(ch, _executed(ch, {"exercise": [stub]}))
    # Run All stops there
    assert "exercise cell" in problem and "outside `with attempt(...)`" in problem
    assert commands.student_errors(ch, _executed(ch, {"": [stub]}))  # an ordinary cell raised
    wrong = _error("NameError", "name 'ForwardData' is not defined")
    assert commands.student_errors(ch, _executed(ch, {"exercise": [wrong]}))


def test_site_page_shows_outputs_figures_and_exercises(tmp_path):
    ch = read_chapter(write(tmp_path, BODY))
    nb = notebook.render(ch, "solution")
    svg = "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'></svg>"
    for cell in nb.cells:
        if cell.cell_type == "code" and notebook.cell_kind(cell) == "":
            cell.outputs = [
                new_output("stream", name="stdout", text="1\n"),
                new_output("display_data", data={"image/svg+xml": svg, "text/plain": "a view"}),
            ]
    page = site.render_page(ch, nb, tmp_path)
    assert "```text { .nb-output .no-copy }\n1\n```" in page  # no copy button over an output
    assert "![a view](ch11_test_files/cell001-1.svg)" in page
    assert (tmp_path / "ch11_test_files" / "cell001-1.svg").read_text() == svg
    assert (
        '!!! question "Exercise ch11.abort"' in page and '??? success "Reference solution"' in page
    )
    assert "**`minisgl/core.py`** · `Req.complete_one`" in page


def test_a_view_with_several_pictures_gives_the_site_one_figure_each(tmp_path):
    """Chapter 11's four problems: one output in the notebook, four figures on the site, each
    the SVG the view drew, with its own alt text."""
    from classroom.display import static_bundle

    ch = read_chapter(write(tmp_path, BODY))
    nb = notebook.render(ch, "solution")
    svgs = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='10'></svg>" for w in (10, 20)
    ]
    for cell in nb.cells:
        if cell.cell_type == "code" and notebook.cell_kind(cell) == "":
            cell.outputs = [
                new_output(
                    "display_data", data=static_bundle(svgs, "two", labels=["first", "second"])
                )
            ]
    page = site.render_page(ch, nb, tmp_path)
    files = sorted((tmp_path / "ch11_test_files").glob("*.svg"))
    assert [f.read_text() for f in files] == svgs, (
        f"expected the two pictures as two files, got {len(files)}"
    )
    assert "![first](" in page and "![second](" in page, (
        "expected each figure with its own alt text"
    )


def test_stale_notebooks_are_reported(tmp_path, monkeypatch):
    ch = read_chapter(write(tmp_path, BODY))
    monkeypatch.setattr(commands, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(commands, "SOLUTIONS", tmp_path / "solutions")
    monkeypatch.setattr(commands, "REPO", tmp_path)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "solutions").mkdir()
    commands.learner_path(ch).write_text(notebook.dumps(notebook.render(ch, "learner")))
    executed = notebook.render(ch, "solution")
    for i, cell in enumerate(c for c in executed.cells if c.cell_type == "code"):
        cell.execution_count = i + 1
        # volatile: ignored
        cell.outputs = [new_output("stream", name="stdout", text=f"run at {i}\n")]
    executed.metadata["language_info"] = {"name": "python", "version": "3.11.7"}  # the kernel's own
    commands.solution_path(ch).write_text(notebook.dumps(executed))
    assert commands.stale(ch) == []
    new_source = write(tmp_path, BODY.replace("More prose.", "Changed prose."))
    problems = commands.stale(read_chapter(new_source))
    assert len(problems) == 2 and all("differ" in p for p in problems)
    # Only prose changed: `refresh` brings both notebooks up to date and keeps the outputs.
    monkeypatch.setattr(commands, "CHAPTERS", tmp_path)
    assert commands.refresh(["ch11"]) == 0
    assert commands.stale(read_chapter(new_source)) == []
    assert "run at 0" in commands.solution_path(ch).read_text()
    assert '"version": "3.11.7"' in commands.solution_path(ch).read_text()  # kept: no churn in git
    # A code cell changed: its outputs must be made again, `refresh` refuses.
    write(tmp_path, BODY.replace("x = 1", "x = 2"))
    assert commands.refresh(["ch11"]) == 1


def test_notebook_runs_record_their_judging_apart_from_the_authors_progress(monkeypatch):
    from judge.progress import PROGRESS_ENV
    from tools.workbook import execute
    from tools.workbook.paths import REPO

    monkeypatch.setenv(PROGRESS_ENV, str(REPO / ".judge_progress.json"))
    monkeypatch.setenv("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1")
    env = execute.kernel_env()
    assert env[PROGRESS_ENV] == str(REPO / "build" / "notebook_progress.json")
    assert "MINISGL_DISABLE_OVERLAP_SCHEDULING" not in env  # the shell's switches stay out


def test_a_listing_shows_the_definition_that_wins_at_run_time():
    import ast

    tree = ast.parse(
        "def f():\n    return 1\n\n\nclass A:\n    def g(self):\n        return 1\n\n"
        "    def g(self):\n        return 2\n\n\ndef f():\n    return 2\n"
    )
    assert [listing.find_definition(tree, name).lineno for name in ("f", "A.g")] == [13, 9]


def test_refresh_keeps_outputs_when_only_a_docstring_changed():
    """An exercise's contract lives in its docstring: editing it cannot change any output."""
    from nbformat.v4 import new_code_cell, new_notebook

    def cells(source):
        return commands._code_cells(new_notebook(cells=[new_code_cell(source)]))

    before = 'def f(x):\n    """Old contract."""\n    return x + 1\n'
    assert cells(before) == cells(
        before.replace("Old contract.", "New contract.\n\n    Receives: x.")
    )
    assert cells(before) != cells(before.replace("x + 1", "x + 2"))
    assert cells("%time f(1)") == cells("%time f(1)")  # IPython syntax: compared as written


def test_links_between_chapters_name_notebooks_in_notebooks_and_pages_on_the_site():
    text = "See [chapter 7](ch07_scheduler.md) and [its rules](ch11_overlap.md#the-rules); [x](https://a.md)."
    assert notebook.notebook_links(text) == (
        "See [chapter 7](ch07_scheduler.ipynb) and "
        "[its rules](ch11_overlap.ipynb#the-rules); [x](https://a.md)."
    )
    assert notebook.page_links(notebook.notebook_links(text)) == text


def test_every_checking_tryout_passes_on_the_reference_in_the_committed_solutions():
    """A try-out's ✔/✘ lines check what the judge checks; on the reference they must all be ✔
    (else the try-out would teach a learner to distrust a right answer)."""
    import nbformat

    problems = []
    for path in sorted(commands.SOLUTIONS.glob("ch*.ipynb")):
        ch = read_chapter(commands.CHAPTERS / f"{path.stem}.md")
        problems += commands.tryout_problems(ch, nbformat.read(path, as_version=4))
    assert not problems, "\n".join(problems)


def test_tryout_checks_print_one_line_each():
    from classroom.tryout import attempt, check

    def stub():
        raise NotImplementedError("ch99.f: write f")

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        with attempt("ch99.f"):
            stub()
        assert check("all slots back", True) is True
        assert check("all slots back", False, "4 missing") is False
    assert out.getvalue().splitlines()[2:] == ["✔ all slots back", "✘ all slots back: 4 missing"]
    assert "ch99.f is not written yet (write f)." in out.getvalue()


def test_attempt_sees_the_stub_through_an_error_raised_from_it():
    # Triton's interpreter re-raises a kernel's exception as its own InterpreterError, from it
    import contextlib
    import io

    from classroom.tryout import attempt

    def launch(message):
        try:
            raise NotImplementedError(message)
        except NotImplementedError as e:
            raise RuntimeError(repr(e)) from e

    out = io.StringIO()
    with contextlib.redirect_stdout(out), attempt("ch99.k"):
        launch("ch99.k: write the kernel")
    assert "ch99.k is not written yet (write the kernel)." in out.getvalue()
    with pytest.raises(RuntimeError), attempt("ch99.k"):
        launch("ch99.other: another exercise's stub")


def test_a_tryout_that_raises_prints_one_line_naming_the_rule_and_the_learners_line(tmp_path):
    # a notebook cell: the learner's function and its try-out, in a file as IPython keeps them
    import contextlib
    import io
    import textwrap

    from classroom.tryout import attempt, check

    cell = tmp_path / "cell.py"
    cell.write_text(
        textwrap.dedent(
            """\
            def revive(obj):
                return obj["uid"] + 1
            with attempt("ch99.revive"):
                check("an untagged dict stays", True)
                for n in (1, 2):
                    got = revive({"role": "user"})
                    check(f"message {n} comes back", got == 2)
            """
        )
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(cell.read_text(), str(cell), "exec"), {"attempt": attempt, "check": check})
    assert out.getvalue().splitlines() == [
        "✔ an untagged dict stays",
        '✘ message 1 comes back: your revive, line 2 (`return obj["uid"] + 1`) raised KeyError: '
        "'uid'",
    ]


def test_a_tryout_stopped_in_the_engine_names_the_engines_line(tmp_path):
    # the learner's function returned something the engine's code then fails on (a kernel given a
    # tile of the wrong shape): the engine's line that used it tells more than the try-out's call
    import contextlib
    import io
    import textwrap

    from classroom.tryout import attempt, check
    from minisgl.core import SamplingParams
    from minisgl.engine import BatchSamplingArgs

    cell = tmp_path / "cell.py"
    cell.write_text(
        textwrap.dedent(
            """\
            def device():
                return "cpu"
            with attempt("ch99.device"):
                args = BatchSamplingArgs.from_params([SamplingParams()], 16, device())
                check("the arguments are built", args is not None)
            """
        )
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace = {"attempt": attempt, "check": check}
        namespace.update(BatchSamplingArgs=BatchSamplingArgs, SamplingParams=SamplingParams)
        exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    (line,) = out.getvalue().splitlines()
    assert line.startswith(
        "✘ the arguments are built: what your function returned, used at the engine's sampler.py "
        "line "
    ), line
    assert "raised TypeError: BatchSamplingArgs.from_params: device must be" in line, line


def test_a_tryout_helper_that_raises_is_named_as_the_tryouts(tmp_path):
    # a helper defined inside the try-out is not the learner's; a message-less error (asyncio's
    # TimeoutError, raised from a CancelledError) is named as itself
    import asyncio
    import contextlib
    import io
    import textwrap

    from classroom.tryout import attempt, check

    cell = tmp_path / "cell.py"
    cell.write_text(
        textwrap.dedent(
            """\
            with attempt("ch99.watch"):
                def wait():
                    try:
                        raise asyncio.CancelledError()
                    except asyncio.CancelledError as e:
                        raise asyncio.TimeoutError() from e
                wait()
                check("a dead worker is seen", True)
            """
        )
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace = {"attempt": attempt, "check": check, "asyncio": asyncio}
        exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    assert out.getvalue().splitlines() == [
        "✘ a dead worker is seen: the try-out's line 6 (`raise asyncio.TimeoutError() from e`) "
        "raised TimeoutError",
    ]


class InterpreterError(Exception):
    """As Triton's interpreter names the error it re-raises a kernel's exception as."""


def _interpret(kernel, *args):
    # as Triton's runtime, outside the notebook's folder: the kernel's error re-raised from it
    try:
        return kernel(*args)
    except Exception as e:
        raise InterpreterError(repr(e)) from e


def test_a_jitted_helpers_error_names_the_helpers_line_not_the_launch(tmp_path):
    import contextlib
    import io
    import textwrap

    from classroom.tryout import attempt, check

    cell = tmp_path / "cell.py"
    cell.write_text(
        textwrap.dedent(
            """\
            def step(x):
                return x.sum(axis=7)
            with attempt("ch99.step"):
                out = launch(step, 3)
                check("the step runs", True)
            """
        )
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace = {"attempt": attempt, "check": check, "launch": _interpret}
        exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    assert out.getvalue().splitlines() == [
        "✘ the step runs: your step, line 2 (`return x.sum(axis=7)`) raised AttributeError: 'int' "
        "object has no attribute 'sum'",
    ]


def _answer_then_tryout(answer, source: str, tryout: str, namespace: dict) -> list:
    """Run a learner's file `answer` (written with `source`), then a try-out cell beside it in
    tmp's cells/ folder (`tryout`, dedented), in one namespace, as a notebook would: the lines
    the try-out printed."""
    import contextlib
    import io
    import textwrap

    answer.parent.mkdir(exist_ok=True)
    answer.write_text(source)
    cell = answer.parent.parent / "cells" / "cell.py"
    cell.parent.mkdir(exist_ok=True)
    cell.write_text(textwrap.dedent(tryout))
    exec(compile(source, str(answer), "exec"), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    return out.getvalue().splitlines()


def test_a_learners_file_beside_no_notebook_is_still_the_learners(tmp_path):
    # a function pasted from a file elsewhere (a learner's module, a trial's file): its line is
    # named, the whole statement on one line, as the learner wrote it over three

    from classroom.tryout import attempt, check

    printed = _answer_then_tryout(
        tmp_path / "mine" / "answer.py",
        "def pick(d, k):\n    return d[\n        k\n    ]\n",
        """\
        with attempt("ch99.pick"):
            got = pick({}, 3)
            check("a missing key is None", got is None)
        """,
        {"attempt": attempt, "check": check},
    )
    assert printed == [
        "✘ a missing key is None: your pick, line 2 (`return d[k]`) raised KeyError: 3",
    ]


def test_a_tryout_helper_that_catches_the_learners_error_names_the_learners_line(tmp_path):
    # chapter 12's refusal() turns what revive raised into a check's seen-string: raised_where
    # adds the learner's line to it, as the try-out's own lines give it (trial 8: a KeyError out
    # of MESSAGE_TYPES[name] showed the rule and the error, not where)

    from classroom.tryout import attempt, check, raised_where

    printed = _answer_then_tryout(
        tmp_path / "cells" / "answer.py",
        "def pick(d, k):\n    return d[k]\n",
        """\
        with attempt("ch99.pick"):
            def refusal(k):
                try:
                    pick({}, k)
                    return "no error"
                except ValueError as e:
                    return str(e)
                except Exception as e:
                    return f"{type(e).__name__}, not a ValueError: {e}{raised_where(e)}"

            said = refusal(3)
            check("a missing key is a ValueError", said.startswith("no such key"), said)
        """,
        {"attempt": attempt, "check": check, "raised_where": raised_where},
    )
    assert printed == [
        "✘ a missing key is a ValueError: KeyError, not a ValueError: 3 (at your pick, line 2: "
        "`return d[k]`)",
    ]


def _kernel_tryout_lines(tmp_path, monkeypatch, tryout: str) -> list:
    """The lines a try-out cell prints when it follows tests/data/mask_on_the_wrong_axis.py (a
    kernel `copy` whose mask Triton refuses) in one file, run as a kernel runs a cell: from a
    file, so the learner's line can be read back."""
    import contextlib
    import io
    import textwrap

    import torch

    from classroom.tryout import attempt, check, kernel_run

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when a kernel is decorated
    cell = tmp_path / "cell.py"
    kernel = (Path(__file__).parent / "data" / "mask_on_the_wrong_axis.py").read_text()
    cell.write_text(kernel + textwrap.dedent(tryout))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace = {"attempt": attempt, "check": check, "kernel_run": kernel_run, "torch": torch}
        exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    return out.getvalue().splitlines()


def test_a_kernels_mask_on_the_wrong_axis_is_said_as_the_rule_it_breaks(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    (line,) = _kernel_tryout_lines(
        tmp_path,
        monkeypatch,
        """
        with attempt("ch99.copy"):
            src, dst = torch.ones(8, 16), torch.zeros(8, 16)
            copy[(1,)](src, dst, 5, 8, 16)
            check("the first 5 rows are copied", bool(dst[:5].eq(1).all()))
        """,
    )
    # labelled with the rule the refusal broke, not the check it stopped (trial 8: a tl.dot
    # refusal shown under the float32-state check's label)
    assert line.startswith(
        "✘ a mask has the shape of the tile it guards, or one that broadcasts to it: your copy, "
        "line 12 (`tile = tl.load(src + rows[:, None]"
    ), line
    assert (
        "raised ValueError: tl.load was given a [8, 16] tile of pointers and a [1, 8] mask" in line
    )


def test_a_kernel_refusal_in_kernel_run_is_one_line_and_the_other_checks_run(tmp_path, monkeypatch):
    # kernel_run: Triton's refusal printed once, under its rule, and the try-out goes on (trial 8:
    # `tl.dot(p, v)` on bfloat16 stopped chapter 17's try-out at its first check)
    pytest.importorskip("triton")
    lines = _kernel_tryout_lines(
        tmp_path,
        monkeypatch,
        """
        with attempt("ch99.copy"):
            src = torch.ones(8, 16)
            for _ in range(2):  # the same refusal twice: said once
                dst = torch.zeros(8, 16)
                ran, _ = kernel_run(lambda: copy[(1,)](src, dst, 5, 8, 16))
                if ran:
                    check("the first 5 rows are copied", bool(dst[:5].eq(1).all()))
            check("a check after the refusal still runs", True)
            ran, got = kernel_run(lambda: 7)
            check("a run that is not refused gives its value", ran and got == 7)
        """,
    )
    assert len(lines) == 3 and lines[1:] == [
        "✔ a check after the refusal still runs",
        "✔ a run that is not refused gives its value",
    ], lines
    assert lines[0].startswith(
        "✘ a mask has the shape of the tile it guards, or one that broadcasts to it: your copy, "
        "line 12"
    ), lines[0]


def test_a_tryout_run_by_exec_without_its_source_names_the_last_rule_checked():
    # exec of a string (a trial's harness, not a kernel): no source to read the next check's
    # rule from, so the line says which check came last before the error
    import contextlib
    import io

    from classroom.tryout import attempt, check

    cell = (
        'with attempt("ch99.pick"):\n'
        '    check("an empty dict gives None", True)\n'
        "    {}[3]\n"
        '    check("a missing key is None", True)\n'
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(cell, "tryout-by-exec", "exec"), {"attempt": attempt, "check": check})
    assert out.getvalue().splitlines() == [
        "✔ an empty dict gives None",
        "✘ the check after “an empty dict gives None”: the try-out's line 3 raised KeyError: 3",
    ]
