"""A chapter whose exercises live in two modules, judged from a saved notebook and live.

The judge runs every exercise cell in the namespace of every module the chapter's exercises go
into. Chapter 13 was rejected with a correct notebook: `next_text` (home: detokenizer.py) uses
`REPLACEMENT`, which the notebook imports in an untagged set-up cell and which only detokenizer.py
has; run again in tokenize.py's namespace, where `detokenize` called it, it raised NameError, and
the report blamed `detokenize`. Here `mark` (home: text.py) uses `MARK`, imported in a set-up cell,
and `Worker.reply` (home: worker.py, which lacks `MARK`) calls `mark`.
"""

from __future__ import annotations

import json

import pytest

from judge.cli import main
from judge_fixtures import code_cell, notebook, write_hints

TEXT = '''
MARK = "~"


def mark(s: str) -> str:
    """s with the mark after it."""
    return s + MARK
'''

WORKER = '''
from .text import mark


class Worker:
    def reply(self, s: str) -> str:
        """The marked text, shouted."""
        return mark(s).upper()
'''

TESTS = """
from twopkg.text import mark
from twopkg.worker import Worker


def test_mark():
    assert mark("a") == "a~"


def test_reply():
    assert Worker().reply("a") == "A~"
"""

REGISTRY = """
root = "{root}"

[ch46]
title = "Two modules"
test_files = ["two_tests/test_two.py"]

[[ch46.exercises]]
name = "mark"
target = "twopkg.text:mark"
tests = ["test_two.py::test_mark", "test_two.py::test_reply"]

[[ch46.exercises]]
name = "reply"
target = "twopkg.worker:Worker.reply"
tests = ["test_two.py::test_reply"]
"""

SETUP = "from twopkg.text import MARK\nfrom twopkg.worker import Worker\nw = Worker()\n"
MARK_OK = "def mark(s):\n    return s + MARK\n"
REPLY_OK = "def reply(self, s):\n    return mark(s).upper()\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    pkg = tmp_path / "twopkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "text.py").write_text(TEXT)
    (pkg / "worker.py").write_text(WORKER)
    (tmp_path / "two_tests").mkdir()
    (tmp_path / "two_tests" / "test_two.py").write_text(TESTS)
    (tmp_path / "registry.toml").write_text(REGISTRY.format(root=tmp_path))
    write_hints(
        tmp_path, "ch46", {"mark": ["the mark goes after"], "reply": ["upper-case what mark gives"]}
    )
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setenv("MINISGL_JUDGE_REGISTRY", str(tmp_path / "registry.toml"))
    monkeypatch.setenv("MINISGL_JUDGE_NOTEBOOKS", str(tmp_path / "notebooks"))
    monkeypatch.setenv("MINISGL_JUDGE_PROGRESS", str(tmp_path / "progress.json"))
    monkeypatch.setenv("MINISGL_JUDGE_VARIANTS", str(tmp_path / "variants"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def judged(project, capsys, mark_src: str, reply_src: str, support: str = ""):
    path = project / "notebooks" / "ch46_two.ipynb"
    cells = [
        code_cell(SETUP),  # untagged: the chapter's set-up cell
        *([code_cell(support, support=True)] if support else []),
        code_cell(mark_src, exercise="ch46.mark"),
        code_cell(reply_src, exercise="ch46.reply"),
    ]
    path.write_text(notebook(cells))
    rc = main(["ch46", "--notebook", str(path), "--json"])
    verdict = json.loads(capsys.readouterr().out)
    return rc, {e["name"]: e for e in verdict["exercises"]}, verdict


def test_a_correct_notebook_is_accepted(project, capsys):
    rc, exercises, verdict = judged(project, capsys, MARK_OK, REPLY_OK)
    messages = [t["message"] for t in verdict["tests"] if t["outcome"] != "passed"]
    assert rc == 0, messages
    assert {n: e["status"] for n, e in exercises.items()} == {"mark": "passing", "reply": "passing"}


def test_a_helper_both_modules_use_finds_the_set_up_cells_imports(project, capsys):
    """A support cell's helper runs in worker.py's namespace too, where `MARK` is not a global:
    the set-up cell's import of it must come along."""
    helper = "def marked(s):\n    return s + MARK\n"
    rc, exercises, verdict = judged(
        project,
        capsys,
        "def mark(s):\n    return marked(s)\n",
        "def reply(self, s):\n    return marked(s).upper()\n",
        support=helper,
    )
    messages = [t["message"] for t in verdict["tests"] if t["outcome"] != "passed"]
    assert rc == 0, messages


def test_a_wrong_mark_is_blamed_and_reply_is_correct_on_its_own(project, capsys):
    """The rerun of `reply` with the reference `mark` must really call the reference: the copy of
    the learner's `mark` made in worker.py's namespace must not stay behind."""
    rc, exercises, _ = judged(project, capsys, "def mark(s):\n    return MARK + s\n", REPLY_OK)
    assert rc == 1
    assert exercises["mark"]["status"] == "failing"
    assert exercises["reply"]["status"] == "passing" and exercises["reply"]["alone"]


def test_a_wrong_reply_is_blamed_alone(project, capsys):
    rc, exercises, _ = judged(project, capsys, MARK_OK, "def reply(self, s):\n    return mark(s)\n")
    assert rc == 1
    assert exercises["reply"]["status"] == "failing"
    assert exercises["mark"]["status"] == "passing"


def test_a_name_from_a_scratch_cell_is_named_as_such(project, capsys):
    """A value set in an untagged cell (not an import) cannot come along: the message says where
    the judge takes code from, not only NameError."""
    rc, _, verdict = judged(project, capsys, "def mark(s):\n    return s + w.SUFFIX\n", REPLY_OK)
    assert rc == 1
    message = next(t["message"] for t in verdict["tests"] if t["outcome"] != "passed")
    assert "name 'w' is not defined" in message
    assert "exercise cells" in message and "support" in message, message


def test_live_sources_carry_what_another_module_lacks(project):
    """judge.check: a class imported from a library or the engine comes along as its import, a
    literal constant as its value."""
    from judge.live import collect_sources
    from judge.registry import load_registry

    cells = project / "kernel_cells.py"  # stands for the kernel: inspect.getsource reads it
    cells.write_text(
        "from twopkg.text import MARK\nfrom twopkg.worker import Worker\n\n"
        + MARK_OK
        + "\n\ndef reply(self, s):\n    assert isinstance(self, Worker)\n"
        + "    return mark(s).upper()\n"
    )
    import kernel_cells

    sources = collect_sources(load_registry().chapter("ch46"), vars(kernel_cells))
    assert "from twopkg.worker import Worker" in sources[None]
    assert "MARK = '~'" in sources[None]
