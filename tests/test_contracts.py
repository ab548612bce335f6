"""Every exercise's stub carries a contract in its docstring, in one shape for all of them:

    <one sentence: what the function does (the stub's NotImplementedError message)>
    <optional paragraph: why>
    Receives: ...   Returns: ...   Leaves: ...   Uses: ...   Checked: ...

so a learner always finds what comes in, what goes out, the state to leave behind, the engine names
to call and what the judge checks. The stub is read as the notebook gets it (`judge.stubs`), without
importing the engine.
"""

from __future__ import annotations

import ast
import re

import pytest

from judge import stubs

FIELDS = ("Receives", "Returns", "Leaves", "Uses", "Checked")
EXERCISES = [ex for chapter in stubs.load_registry().chapters.values() for ex in chapter.exercises]


def _stub(ex):
    """(the stub's docstring, cleaned; the message of the NotImplementedError its body raises)."""
    fn = ast.parse(stubs.stub_source(ex.chapter, ex.name)).body[0]
    raised = fn.body[-1]
    message = raised.exc.args[0].value if isinstance(raised, ast.Raise) else ""
    return ast.get_docstring(fn) or "", message


def _fields(doc: str) -> dict:
    """{field: its text}: a field starts a line with `Name:` and runs to the next field or blank
    line."""
    found, current = {}, None
    for line in doc.splitlines():
        head = re.match(r"(\w+):\s*(.*)", line)
        if head and head.group(1) in FIELDS:
            current = head.group(1)
            found[current] = head.group(2).strip()
        elif current and line.strip():
            found[current] += " " + line.strip()
        else:
            current = None
    return found


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_stub_docstring_states_the_contract(ex):
    doc, _ = _stub(ex)
    fields = _fields(doc)
    missing = [f for f in FIELDS if not fields.get(f)]
    assert not missing, (
        f"{ex.id}: the stub's docstring has no (or an empty) {', '.join(missing)} field"
    )
    order = [m.group(1) for m in re.finditer(r"^(\w+):", doc, re.M) if m.group(1) in FIELDS]
    assert order == list(FIELDS), (
        f"{ex.id}: the contract's fields come as {order}, not {list(FIELDS)}"
    )


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_stub_sentinel_is_the_docstrings_first_sentence(ex):
    doc, message = _stub(ex)
    first = stubs._first_sentence(doc.split("\n\n")[0])
    assert first, f"{ex.id}: the docstring does not open with one short sentence (<= 90 characters)"
    assert message == f"{ex.id}: {first}", (
        f"{ex.id}: the stub raises {message!r}, not its first sentence"
    )


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_stub_contract_names_what_it_uses(ex):
    uses = _fields(_stub(ex)[0]).get("Uses", "")
    # A name in backticks (`self.cache_manager.cache_req` (ch08)), or a plain "only torch".
    assert re.search(r"`[A-Za-z_][\w.]*", uses) or uses.lower().startswith("only torch"), (
        f"{ex.id}: the Uses field names no engine name in backticks (nor says 'only torch')"
    )


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_stub_docstring_lines_fit_100_columns(ex):
    src = stubs.stub_source(ex.chapter, ex.name)
    doc = ast.parse(src).body[0].body[0]  # the docstring's expression (the raise, if there is none)
    wide = [ln for ln in src.splitlines()[doc.lineno - 1 : doc.end_lineno] if len(ln) > 100]
    assert not wide, f"{ex.id}: {len(wide)} docstring line(s) are wider than 100 columns"
