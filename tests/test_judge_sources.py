"""The judge's parent-side work, which runs no learner code: the registry, reading notebooks and
files, telling stubs from attempts, and the stub API the notebook generator uses."""

from __future__ import annotations

import ast
import json

import pytest

from judge import stubs
from judge.registry import UnknownChapter, chapter_key, load_registry, test_matches
from judge.sources import SourceError, find_notebook, from_file, from_notebook, from_sources
from judge_fixtures import code_cell, fake_project, notebook


@pytest.fixture
def project(tmp_path, monkeypatch):
    return fake_project(tmp_path, monkeypatch)


@pytest.fixture
def ch42(project):
    return load_registry().chapter("ch42")


def test_chapter_names():
    assert [chapter_key(n) for n in ("ch11", "ch3", "7", 7, " CH01 ")] == [
        "ch11",
        "ch03",
        "ch07",
        "ch07",
        "ch01",
    ]
    assert chapter_key("chapter11") is None and chapter_key("ch123") is None


def test_unknown_chapter_names_the_known_ones():
    with pytest.raises(UnknownChapter, match="ch00, ch01"):
        load_registry().chapter("ch99")


def test_registry_test_references_match_node_ids():
    assert test_matches("test_a.py::test_b", "tests/test_a.py::test_b")
    assert test_matches("tests/test_a.py::test_b", "tests/test_a.py::test_b[radix-1]")
    assert not test_matches("test_a.py::test_b", "tests/test_a.py::test_bc")
    assert not test_matches("test_a.py::test_b", "tests/test_x.py::test_b")


def test_the_real_registry_names_real_targets():
    registry = load_registry()
    # every chapter from 0 to 26, in order, none missing
    keys = list(registry.chapters)
    assert keys == [f"ch{i:02d}" for i in range(27)], keys
    for chapter in registry.chapters.values():
        for ex in chapter.exercises:
            assert ex.id == f"{chapter.key}.{ex.name}"
            stubs.reference_source(chapter.key, ex.name)  # the target exists in minisgl's source


def test_stub_keeps_signature_and_docstring_and_raises_the_sentinel():
    src = stubs.stub_source("ch01", "complete_one")
    fn = ast.parse(src).body[0]
    ref = ast.parse(stubs.reference_source("ch01", "complete_one")).body[0]
    assert fn.name == "complete_one" and not fn.decorator_list
    assert ast.dump(fn.args) == ast.dump(ref.args)
    assert ast.get_docstring(fn) == ast.get_docstring(ref)
    ns: dict = {}
    exec(src, ns)
    with pytest.raises(NotImplementedError, match=r"^ch01\.complete_one: "):
        ns["complete_one"](object())


def test_reference_source_drops_only_kind_decorators():
    # was @property
    assert stubs.reference_source("ch01", "extend_len").startswith("def extend_len(self)")
    # was @classmethod
    assert stubs.reference_source("ch03", "from_hf").startswith("def from_hf(cls,")
    assert "return self.device_len - self.cached_len" in stubs.reference_source(
        "ch01", "extend_len"
    )


def test_stubs_of_the_fake_chapter(project, ch42):
    src = stubs.stub_source("ch42", "starting_at")
    assert src.splitlines()[0] == 'def starting_at(cls, n: int) -> "Counter":'
    assert "raise NotImplementedError('ch42.starting_at: A counter that starts at n')" in src
    assert [e.name for e in stubs.exercises(42)] == ["double", "bump", "is_big", "starting_at"]


def test_notebook_takes_exercise_and_support_cells_only(project, ch42):
    path = project.notebooks / "ch42_fake.ipynb"
    path.write_text(
        notebook(
            [
                code_cell("x = undefined_thing +  # a scratch cell that does not even parse"),
                code_cell("def helper(x):\n    return x * SCALE\n", support=True),
                code_cell(
                    "def double(x):\n    return helper(x)\n\nprint(double(2))  # try-out\n",
                    exercise="ch42.double",
                ),
                code_cell(
                    '%%time\ndef bump(self, by=1):\n    """doc"""\n    raise '
                    'NotImplementedError("ch42.bump: ...")\n',
                    exercise="ch42.bump",
                ),
                # another chapter's
                code_cell("def is_big(self):\n    return True\n", exercise="ch41.is_big"),
            ]
        )
    )
    assert find_notebook(ch42, project.notebooks) == path
    code = from_notebook(path, ch42)
    assert [s.exercise for s in code.snippets] == [None, "double", "bump"]
    assert "print(double(2))" not in code.snippets[1].source  # try-out code is not judged
    assert code.snippets[1].source.count("\n") >= 3  # ...but line numbers are kept
    assert code.attempted == {"double": True, "bump": False}
    assert set(code.problems) == {"is_big", "starting_at"}  # not defined in this notebook
    assert "no `def is_big(...)` found" in code.problems["is_big"]


def test_a_syntax_error_breaks_only_its_own_exercise(project, ch42):
    path = project.notebooks / "ch42_fake.ipynb"
    path.write_text(
        notebook(
            [
                code_cell("def double(x)\n    return 2 * x\n", exercise="ch42.double"),
                code_cell("def bump(self, by=1):\n    self.n += by\n", exercise="ch42.bump"),
            ]
        )
    )
    code = from_notebook(path, ch42)
    assert code.problems["double"].startswith(
        "syntax error in ch42_fake.ipynb cell 2 (ch42.double), line 1"
    )
    assert "bump" not in code.problems and code.attempted["bump"]


def test_a_syntax_error_in_a_file_breaks_every_exercise(project, ch42):
    code = from_file(project.write("broken.py", "def double(x):\n    return (x\n"), ch42)
    assert set(code.problems) == {"double", "bump", "is_big", "starting_at"}
    assert all("syntax error" in p and "line 2" in p for p in code.problems.values())


def test_a_renamed_function_gets_a_suggestion(project, ch42):
    code = from_sources(ch42, {None: "def dobule(x):\n    return 2 * x\n"}, origin="test")
    assert (
        "there is a `def dobule`: the judge needs the exact name `double`"
        in code.problems["double"]
    )


def test_another_exercise_of_the_chapter_is_no_misspelling():
    ch13 = load_registry().chapter("ch13")  # its exercises include detokenize and tokenize
    src = "def detokenize(self, msg):\n    return None\n\ndef tokenise(self, msg):\n    pass\n"
    assert code_problem(ch13, src, "tokenize") == (
        "no `def tokenize(...)` found (there is a `def tokenise`: the judge needs the exact name "
        "`tokenize`)"
    )
    assert code_problem(ch13, src.split("\n\n")[0], "tokenize") == "no `def tokenize(...)` found"


def code_problem(chapter, source: str, exercise: str) -> str:
    return from_sources(chapter, {None: source}, origin="test").problems[exercise]


def test_decorated_kinds_are_accepted_in_learner_code(project, ch42):
    src = (
        "@property\ndef is_big(self):\n    return self.n > 10\n\n@classmethod\ndef "
        "starting_at(cls, n):\n    return cls()\n"
    )
    code = from_sources(ch42, {None: src}, origin="test")
    assert code.attempted == {"is_big": True, "starting_at": True}


@pytest.mark.parametrize(
    "content,message",
    [
        ("{not json", "broken JSON at line 1"),
        (json.dumps({"cells": "nope"}), "has no list of cells"),
        (b"\xff\xfe\x00garbage", "cannot read notebook"),
    ],
)
def test_corrupt_notebooks_are_reported(project, ch42, content, message):
    path = project.notebooks / "ch42_fake.ipynb"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SourceError, match=message):
        from_notebook(path, ch42)


def test_missing_notebook_and_file(project, ch42):
    with pytest.raises(SourceError, match=r"no notebook for ch42: expected .*ch42_\*\.ipynb"):
        find_notebook(ch42, project.notebooks)
    with pytest.raises(SourceError, match="file not found"):
        from_file(project.root / "nope.py", ch42)


def test_live_sources_bring_helpers_decorators_and_modules_first(project, ch42):
    """What judge.check collects from a kernel: the exercises, and before them what they need."""
    import linecache

    from judge.live import collect_sources

    src = (
        "import functools as ft\n\nLIMIT = 10\n\ndef twice(f):\n    @ft.wraps(f)\n    def w(*a):\n"
        "        return f(*a)\n    return w\n\n@twice\ndef is_big(self):\n    return self.n > "
        "LIMIT\n\n"
        "def unrelated():\n    pass\n"
    )
    namespace = {"__name__": "__main__"}
    linecache.cache["<cell-1>"] = (len(src), None, src.splitlines(True), "<cell-1>")
    exec(compile(src, "<cell-1>", "exec"), namespace)
    namespace["double"] = __import__(
        "fakepkg.mod", fromlist=["double"]
    ).double  # imported, not theirs
    sources = collect_sources(ch42, namespace)
    assert list(sources) == [None, "is_big"]  # the imported reference `double` is not the learner's
    helpers = sources[None]
    assert (
        helpers.startswith("import functools as ft\n")
        and "LIMIT = 10" in helpers
        and "def twice" in helpers
    )
    assert "unrelated" not in helpers
    assert sources["is_big"].startswith("@twice\ndef is_big(self):")


def test_learner_kernels_keep_the_plain_torch_path_on_a_gpu():
    """The GPU's Triton fast paths would skip a learner's rms_norm or torch attention backend."""
    from judge.judging import path_env, spec_unit

    registry = load_registry()

    def env_for(chapter: str, exercise: str):
        ch = registry.chapter(chapter)
        code = from_sources(
            ch, {exercise: stubs.stub_source(chapter, exercise)}, "stub", missing="reference"
        )
        return path_env([spec_unit(code, ch)], [ch])

    assert env_for("ch02", "rms_norm") == {"MINISGL_FUSED_KERNELS": "0"}
    assert env_for("ch05", "decode_attention") == {"MINISGL_ATTENTION_BACKEND": "torch"}
    # the fused kernel stores K/V
    assert env_for("ch04", "store_kv") == {"MINISGL_FUSED_KERNELS": "0"}
    assert env_for("ch01", "complete_one") == {}


def test_live_sources_leave_out_a_helper_that_only_shares_an_attributes_name(project, ch42):
    """`self.n` reads attribute `n`: a notebook function called `n` is not a helper of is_big."""
    import linecache

    from judge.live import collect_sources

    src = "def n():\n    return mine.x\n\ndef is_big(self):\n    return self.n > 10\n"
    namespace = {"__name__": "__main__"}
    linecache.cache["<cell-2>"] = (len(src), None, src.splitlines(True), "<cell-2>")
    exec(compile(src, "<cell-2>", "exec"), namespace)
    sources = collect_sources(ch42, namespace)
    assert "def n()" not in sources.get(None, ""), (
        "an attribute's name was taken for a notebook helper"
    )
