"""What a failed test says, as the learner reads it: the test's own message or the comparison in
brief (never a config's or a tensor's repr), the learner's line it came from, a pydantic error as
one line per field, a stub's NotImplementedError or a stand-in as such. Used by plugin.py (each
test's Result) and timer.py (a budget timeout); `learner` is the plugin's run state (its `labels`,
the file names of learner code, and its `spec`), None outside a judged run."""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Any, Dict, List

import pytest

from .protocol import Result

SENTINEL = re.compile(r"^(ch\d\d\.\w+):")
MAX_MESSAGE = 1500
MAX_LINES = 10
MESSAGE_LINES = 3  # a failed test's message: what was expected, what happened
MESSAGE_CHARS = 400


def final_record(nodeid: str, phases: List[pytest.TestReport]) -> Result:
    record = Result(nodeid, "passed", duration=round(sum(p.duration for p in phases), 3))
    bad = next((p for p in phases if p.failed), None)
    if bad is None:
        if any(p.skipped for p in phases):
            skip = next(p for p in phases if p.skipped)
            record.outcome = "skipped"
            if isinstance(skip.longrepr, tuple) and len(skip.longrepr) == 3:
                record.message = str(skip.longrepr[2]).removeprefix("Skipped: ")
        return record
    info = getattr(bad, "_judge_info", None) or {
        "message": shorten(str(bad.longrepr), keep_end=True)
    }
    for name in ("message", "sentinel", "standin", "where", "culprit"):
        if name in info:
            setattr(record, name, info[name])
    if info.get("timeout"):
        record.outcome = "timeout"
    elif bad.when == "call":
        record.outcome = "failed"
    else:
        record.outcome = "error"  # a fixture (setup/teardown) failed
    return record


def describe(excinfo: pytest.ExceptionInfo, learner) -> Dict[str, Any]:
    from .function_wrapping import LearnerCodeError

    exc = excinfo.value
    causes = chain(exc)
    sentinel = next(
        (
            m.group(1)
            for e in causes
            if isinstance(e, NotImplementedError)
            for m in [SENTINEL.match(str(e))]
            if m
        ),
        None,
    )
    standin = any(isinstance(e, LearnerCodeError) for e in causes)
    if isinstance(exc, AssertionError):
        message = _assertion_message(str(exc)) or _bare_assert(exc, learner)
    elif sentinel or standin:
        message = str(
            next(e for e in causes if isinstance(e, (NotImplementedError, LearnerCodeError)))
        )
        message = f"{'NotImplementedError' if sentinel else 'LearnerCodeError'}: {message}"
    else:
        message = excinfo.exconly()
        if isinstance(exc, pytest.fail.Exception):  # pytest.fail("..."): the test's own words
            message = message.removeprefix("Failed: ")
        words = _kernel_words(exc)
        if words:  # Triton's refusal in a learner's kernel, as chapter 17 words the rule it broke
            message = words
        if isinstance(exc, NameError) and _raised_in_learner_code(exc, learner):
            message += NAME_ERROR_NOTE
        invalid = _validation_error(exc)
        if invalid:
            message = invalid
        rule = exercise_rule(causes, learner)
        if rule:
            message = rule
        from classroom.engine_names import in_learner_terms

        message = in_learner_terms(message)  # a scheduler mixin's name as "Scheduler"
    text = message
    timeout = isinstance(exc, BaseException) and "Timeout" in text and "pytest-timeout" in text
    if timeout:
        text = "the test did not finish in time (an endless loop, or far too slow)"
    return {
        "message": shorten(summarize_reprs(text)),
        "sentinel": sentinel,
        "standin": standin,
        "where": None if timeout else learner_frame(causes, learner),
        "timeout": timeout,
    }


def _kernel_words(exc: BaseException) -> str | None:
    """A Triton error raised in the learner's kernel in the chapter's words (the innermost
    error's type, then the rule it broke with its values); None for any other error."""
    if _loaded("triton") is None:
        return None  # no kernel ran: never import triton to describe an error
    from classroom.kernel_errors import causes, in_chapter_words

    words = in_chapter_words(exc)
    return f"{type(causes(exc)[-1]).__name__}: {words}" if words else None


def _assertion_message(text: str) -> str:
    """A failed assert as the learner should read it. pytest's rewriting appends its explanation
    (`assert 0 == 8`, then `+  where 8 = <a config's repr>.max_running_req` lines) to the test's
    own message: where the test wrote a message, that message alone says what was expected; where
    it did not, the comparison's first line does (its values summarised by
    pytest_assertrepr_compare below), without the `where` lines."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("assert ")), None)
    if start is None:
        return text.strip()  # the message of an assert pytest did not rewrite ("": it had none)
    own = "\n".join(lines[:start]).strip()
    if own:
        return own
    explanation = [
        ln.strip() for ln in lines[start + 1 :] if ln.strip() and not ln.lstrip().startswith("+")
    ]
    detail = next((ln for ln in explanation if ln.startswith(DETAIL_PREFIX)), None)
    return lines[start] + (f" ({detail})" if detail else "")


def _bare_assert(exc: AssertionError, learner) -> str:
    """An assert without a message that pytest did not rewrite: in the engine, the learner's code or
    a test helper. Its line says what was expected."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "AssertionError (without a message)"
    f = frames[-1]
    # its "in your code" line says where
    learners = learner is not None and f.filename in learner.labels
    where = "" if learners else f" ({_short_path(f.filename)}, line {f.lineno})"
    return f"an assert without a message failed{where}: {(f.line or '').strip()[:100]}"


def _short_path(filename: str) -> str:
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return path.name


DETAIL_PREFIX = "first difference:"
REPR_MAX = 60


def brief(value: Any) -> str:
    """A value in a few words: a tensor as its shape and dtype (its numbers when there are a few),
    a config or other object as its class name, anything else cut to REPR_MAX characters."""
    import dataclasses

    torch = _loaded("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if value.numel() <= 6 and value.dim() <= 1:  # a few numbers say more than a shape
            small = f"tensor({value.tolist()}, dtype={dtype})"
            if len(small) <= REPR_MAX:
                return small
        return f"tensor(shape={list(value.shape)}, dtype={dtype})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"{type(value).__name__}(...)"
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
    text = summarize_reprs(text)
    if len(text) <= REPR_MAX:
        return text
    if isinstance(value, (list, tuple, dict, set)):
        return f"{text[:REPR_MAX]}... ({len(value)} items)"
    return text[:REPR_MAX] + "..."


def _loaded(module: str):
    import sys

    return sys.modules.get(module)  # never import torch just to describe a value


_TENSOR_REPR = re.compile(r"tensor\(\[")
_OBJECT_REPR = re.compile(r"<(?:[\w.]+\.)?(\w+) object at 0x[0-9a-f]+>")


def summarize_reprs(text: str) -> str:
    """Reprs that reach a message as text (a test's f-string, an exception's message): a long
    `tensor([...])` becomes `tensor([...])`, `<minisgl.x.Y object at 0x7f..>` becomes `<Y>`."""
    text = _OBJECT_REPR.sub(r"<\1>", text)
    out, pos = [], 0
    for m in _TENSOR_REPR.finditer(text):
        if m.start() < pos:
            continue
        end = _closing(text, m.end() - 1)
        if end is None or end - m.start() <= REPR_MAX:
            continue
        out.append(text[pos : m.start()] + "tensor([...])")
        pos = end + 1
        if (
            text[pos : pos + 1] == ")"
        ):  # the repr's own closing parenthesis (after `, dtype=...` too)
            pos += 1
        elif text.startswith(", ", pos):
            close = text.find(")", pos)
            pos = close + 1 if close != -1 else pos
    return "".join(out) + text[pos:]


def _closing(text: str, open_at: int) -> int | None:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"[": 1, "]": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return None


def chain(exc: BaseException) -> List[BaseException]:
    out: List[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _validation_error(exc: BaseException) -> str | None:
    """A pydantic ValidationError (the openai client, or the server's models, reading what the
    learner's code built) as one plain line per wrong field, instead of pydantic's block."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or not callable(errors):
        return None
    try:
        items = errors()
    except Exception:
        return None
    parts = []
    for e in items[:3]:
        field = ".".join(str(x) for x in e.get("loc", ())) or "(the whole value)"
        got = repr(e.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        parts.append(f"`{field}`: {e.get('msg', 'invalid')} (got {got})")
    more = f" (and {len(items) - 3} more)" if len(items) > 3 else ""
    title = getattr(exc, "title", "the value")
    return f"{title} cannot be built from what your code returned: " + "; ".join(parts) + more


NAME_ERROR_NOTE = (
    " in your code as the judge runs it: it takes your exercise cells, cells tagged support and"
    " the imports of names they use, not values set in other cells; define it in the exercise's"
    " cell (or a support cell)"
)


def _raised_in_learner_code(exc: BaseException, learner) -> bool:
    """Whether the innermost frame of `exc` is the learner's code (not the engine's or a test's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return learner is not None and bool(frames) and frames[-1].filename in learner.labels


def exercise_rule(causes: List[BaseException], learner) -> str | None:
    """An error raised in an exercise's own function, said as the rule the registry words for
    that kind of error (the exercise's `raises`): "filter_reqs raised KeyError: 0: <the rule>",
    in every test that meets it, an engine run's too; None where no rule is worded for it."""
    if learner is None:
        return None
    rules = {
        (e.attr, kind): words
        for u in learner.spec.units
        for e in u.exercises
        if e.swap
        for kind, words in e.raises.items()
    }
    for exc in causes:
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if f.filename in learner.labels
        ]
        if frames:
            name = frames[-1].name
            words = rules.get((name, type(exc).__name__))
            return f"{name} raised {type(exc).__name__}: {exc}; {words}" if words else None
    return None


def learner_frame(causes: List[BaseException], learner) -> str | None:
    """The innermost line of learner code in the traceback: where the learner should look.
    Written `<label>, line N, in <function>: <code>`; when that function is a helper rather than an
    exercise, ` (called from <exercise function>)` follows the function's name (the innermost
    exercise frame around it), so the report can show the line under the exercise it belongs to
    (judging.where_owner reads it back)."""
    if learner is None:
        return None
    attrs = {e.attr for u in learner.spec.units for e in u.exercises}
    for exc in causes:
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if f.filename in learner.labels
        ]
        if frames:
            f = frames[-1]
            line = (f.line or "").strip()
            where = f"{f.filename}, line {f.lineno}, in {f.name}"
            if f.name not in attrs:
                caller = next((g.name for g in reversed(frames) if g.name in attrs), None)
                where += f" (called from {caller})" if caller else ""
            return where + (f": {line[:100]}" if line else "")
    return None


def shorten(
    text: str, keep_end: bool = False, max_lines: int | None = None, max_chars: int | None = None
) -> str:
    """At most `max_lines` lines and `max_chars` characters: a test's message is short (it is read
    in a list of failures), a collection error keeps its end (where the traceback says what
    broke)."""
    max_lines = max_lines or (MAX_LINES if keep_end else MESSAGE_LINES)
    max_chars = max_chars or (MAX_MESSAGE if keep_end else MESSAGE_CHARS)
    lines = [ln for ln in text.rstrip().splitlines() if ln.strip() and "Use -v to get" not in ln]
    if len(lines) > max_lines:
        cut = f"... ({len(lines) - max_lines} more lines)"
        lines = ([cut] + lines[-max_lines:]) if keep_end else (lines[:max_lines] + [cut])
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = ("..." + text[-max_chars:]) if keep_end else (text[:max_chars] + "...")
    return text
