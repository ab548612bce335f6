"""The judge's report in a notebook (judge/notebook_report.py): one output that says what is
running, then becomes the whole report, each line whole; the same lines as the terminal's."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("IPython", reason="the workbook extra (pip install -e '.[workbook]')")

from judge import notebook_report  # noqa: E402
from judge_fixtures import SOLUTION, fake_project  # noqa: E402


@pytest.fixture
def project(tmp_path, monkeypatch):
    return fake_project(tmp_path, monkeypatch)


@pytest.fixture
def kernel(monkeypatch):
    """A stand-in for a Jupyter kernel's display: every output and every update to it, as its
    HTML; `outputs.plain` holds their text/plain forms, what a headless run shows."""

    class Outputs(list):
        plain: list = []

    outputs = Outputs()
    outputs.plain = []

    def forms(obj, raw):
        if raw:  # a bundle of mime types
            return obj.get("text/html"), obj.get("text/plain")
        return obj.data, repr(obj)  # an IPython.display.HTML: a headless run shows its repr

    class Handle:
        def __init__(self, index):
            self.index = index

        def update(self, obj, raw=False, **_):
            html, plain = forms(obj, raw)
            outputs[self.index].append(html)
            outputs.plain[self.index].append(plain)

    def display(obj, display_id=None, raw=False, **_):
        html, plain = forms(obj, raw)
        outputs.append([html])
        outputs.plain.append([plain])
        return Handle(len(outputs) - 1) if display_id else None

    monkeypatch.setattr("IPython.display.display", display)
    monkeypatch.setattr(notebook_report, "in_notebook", lambda: True)
    return outputs


def _define(namespace, source):
    """As a Jupyter cell does: run the source with its text where inspect.getsource finds it."""
    import linecache

    name = f"<ipython-input-{len(linecache.cache)}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)


def _body(text: str) -> str:
    """From the exercise table on (the lines above say what was judged, and how long it took),
    with the terminal's hard wraps undone and the hint line (worded for where one is) left out."""
    text = text[text.index("exercise") :]
    text = " ".join(line for line in text.split("\n") if not line.startswith("Stuck?"))
    return " ".join(re.sub(r"\d+\.\d+ s\b", "_ s", text).split())  # times differ from run to run


def _text(html: str) -> str:
    import html as h

    return h.unescape(re.sub(r"<[^>]+>", "", html))


def test_the_report_is_one_output_that_first_says_what_runs(kernel, project):
    from judge.live import check

    namespace = {"__name__": "__main__"}
    _define(namespace, SOLUTION)
    check("ch42", namespace=namespace)
    assert len(kernel) == 1, f"expected the report as one output, got {len(kernel)} outputs"
    first, last = _text(kernel[0][0]), _text(kernel[0][-1])
    assert "judging ch42: running" in first, f"expected a 'running' line first, got {first[:80]!r}"
    assert "7/7 tests passed" in last, (
        f"expected the verdict in the final output, got {last[-120:]!r}"
    )


def test_a_headless_run_shows_the_report_as_text(kernel, project):
    """nbconvert or a console kernel shows text/plain: the report's lines, not
    `<IPython.core.display.HTML object>`."""
    from judge.live import check

    namespace = {"__name__": "__main__"}
    _define(namespace, SOLUTION)
    check("ch42", namespace=namespace)
    first, last = kernel.plain[0][0], kernel.plain[0][-1]
    assert "judging ch42: running" in first and "7/7 tests passed" in last, (
        f"a headless run should show the running line, then the report, as text; got {first!r} "
        f"then {last[-120:]!r}"
    )


def test_long_lines_are_not_cut_or_wrapped(kernel):
    long = "x" * 180 + " end"

    def render(_, console):
        console.print("short line")
        console.print(long)

    notebook_report.shown("running", lambda: None, render)
    text = _text(kernel[0][-1])
    assert long in text.splitlines(), (
        "expected a 184-character line kept whole (the browser wraps it), it was broken"
    )


def test_the_report_has_the_terminals_lines(kernel, project, capsys):
    """The notebook shows what `python judge.py` prints, line for line (but the first two lines:
    what was judged and how long it took)."""
    from judge.cli import main
    from judge.live import check
    from judge_fixtures import code_cell, notebook

    (project.notebooks / "ch42_fake.ipynb").write_text(
        notebook([code_cell(SOLUTION, exercise="ch42.double")])
    )
    main(["ch42"])
    terminal = _body(capsys.readouterr().out)
    namespace = {"__name__": "__main__"}
    _define(namespace, SOLUTION)
    check("ch42", namespace=namespace)
    assert _body(_text(kernel[0][-1])) == terminal, (
        "expected the notebook's report to say what the terminal's says"
    )
