"""The judge's pytest plugin (`pytest -p judge.plugin`), active only when MINISGL_JUDGE_SPEC names a
spec file (a `protocol.RunSpec`, written by runner.py).

At `pytest_configure` it swaps the learner's functions in (swap.py). As the tests run it appends one
event (protocol.py: swapped, collected, collect_error, start, result, finished, fatal; timer.py adds
cpu_time and over_budget) per line to the spec's results file, flushed at once, so that what
happened survives a test that ends the process (`os._exit`, a crash, a kill on timeout).
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List

import pytest

from . import settings
from .protocol import (
    Collected,
    CollectError,
    Event,
    Fatal,
    Finished,
    Result,
    RunSpec,
    Start,
    Swapped,
)

SPEC_ENV = settings.SPEC.name
SENTINEL = re.compile(r"^(ch\d\d\.\w+):")
MAX_MESSAGE = 1500
MAX_LINES = 10
MESSAGE_LINES = 3  # a failed test's message: what was expected, what happened
MESSAGE_CHARS = 400


class _Judge:
    def __init__(self, spec_path: str) -> None:
        self.spec = RunSpec.read(spec_path)
        self.results = open(self.spec.results, "a", encoding="utf-8")
        self.labels = {s.label for s in self.spec.snippets}
        self.test_dirs = [str(Path(d)) for d in self.spec.test_dirs]
        self.skip = set(self.spec.done)  # tests of an earlier, interrupted run
        self.reports: Dict[str, List[pytest.TestReport]] = {}
        self.swapped = None  # swap.SwapState: what was replaced, for rescans after collection
        self.order: List[str] = []  # a shard's process: the whole collection (Collected.order)

    def write(self, event: Event) -> None:
        self.results.write(event.to_json() + "\n")
        self.results.flush()


_judge: _Judge | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _judge
    path = settings.SPEC.read()
    if not path or _judge is not None:
        return
    _judge = _Judge(path)
    if _judge.spec.device == "cuda" and not _cuda_available():
        _judge.write(
            Fatal("--device cuda, but there is no usable CUDA GPU here (use --device cpu, or auto)")
        )
        pytest.exit("no CUDA GPU", returncode=4)
    from . import blocking, device_warmup, serving, swap

    # Before the first test's clock starts: not counted in its budget (device_warmup.py says why).
    device_warmup.warm_up(_judge.spec.device)

    blocking.install(_judge.labels)  # before the swap: `from time import sleep` gets it too
    serving.hook_into_servers()  # a server a test starts serves the same code, in its 3 processes
    _judge.swapped = swap.apply(_judge.spec.units, _judge.test_dirs)
    report = _judge.swapped.report
    _judge.write(Swapped(report.problems, report.general))


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(session, config, items) -> None:
    if _judge is None:
        return
    index, count = _judge.spec.shard
    if count > 1:  # this process's share of the run (shards.py), chosen before the skips below
        from .budgets import test_key
        from .shards import share

        _judge.order = [i.nodeid for i in items]
        measured = _judge.spec.budget.measured if _judge.spec.budget is not None else {}
        cost = {
            i.nodeid: measured[test_key(i.nodeid)] for i in items if test_key(i.nodeid) in measured
        }
        mine = set(share(_judge.order, cost, index, count))
        _deselect(config, items, lambda i: i.nodeid not in mine)
    if _judge.skip:
        _deselect(config, items, lambda i: i.nodeid in _judge.skip)
    if _judge.spec.first_last and len(items) > 1:
        items[:] = items[1:] + items[:1]


def _deselect(config, items, drop) -> None:
    dropped = [i for i in items if drop(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if not drop(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    if _judge is None:
        return
    from . import swap

    if _judge.swapped is not None:
        # test modules hold module-level functions too
        swap.rescan(_judge.swapped, _judge.test_dirs)
    _judge.write(Collected([item.nodeid for item in session.items], order=_judge.order))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _judge is not None and report.failed:
        text = str(report.longrepr)
        _judge.write(CollectError(report.nodeid or "(collection)", _shorten(text, keep_end=True)))


def pytest_runtest_logstart(nodeid: str, location) -> None:
    if _judge is not None:
        from . import blocking

        blocking.reset()
        _judge.write(Start(nodeid))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if _judge is not None and call.excinfo is not None:
        timer = sys.modules.get("judge.timer")  # a budget timeout, or a test not run after one
        info = timer.describe(call.excinfo, item) if timer is not None else None
        info = info or _describe(call.excinfo)
        from . import blocking

        blocked = blocking.note()
        if blocked:  # the reason comes first: the failure itself only shows what followed from it
            info = {**info, "message": f"{blocked}\n{info.get('message') or ''}".strip()}
        report._judge_info = info  # type: ignore[attr-defined]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _judge is None:
        return
    phases = _judge.reports.setdefault(report.nodeid, [])
    phases.append(report)
    if report.when != "teardown":
        return
    _judge.write(_final_record(report.nodeid, phases))
    del _judge.reports[report.nodeid]


def pytest_sessionfinish(session) -> None:
    if _judge is not None:
        _judge.write(Finished())


# ---------------------------------------------------------------------- describing outcomes


def _final_record(nodeid: str, phases: List[pytest.TestReport]) -> Result:
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
        "message": _shorten(str(bad.longrepr), keep_end=True)
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


def _describe(excinfo: pytest.ExceptionInfo) -> Dict[str, Any]:
    from .swap import LearnerCodeError

    exc = excinfo.value
    chain = _chain(exc)
    sentinel = next(
        (
            m.group(1)
            for e in chain
            if isinstance(e, NotImplementedError)
            for m in [SENTINEL.match(str(e))]
            if m
        ),
        None,
    )
    standin = any(isinstance(e, LearnerCodeError) for e in chain)
    if isinstance(exc, AssertionError):
        message = _assertion_message(str(exc)) or _bare_assert(exc)
    elif sentinel or standin:
        message = str(
            next(e for e in chain if isinstance(e, (NotImplementedError, LearnerCodeError)))
        )
        message = f"{'NotImplementedError' if sentinel else 'LearnerCodeError'}: {message}"
    else:
        message = excinfo.exconly()
        if isinstance(exc, pytest.fail.Exception):  # pytest.fail("..."): the test's own words
            message = message.removeprefix("Failed: ")
        if isinstance(exc, NameError) and _raised_in_learner_code(exc):
            message += NAME_ERROR_NOTE
        invalid = _validation_error(exc)
        if invalid:
            message = invalid
    text = message
    timeout = isinstance(exc, BaseException) and "Timeout" in text and "pytest-timeout" in text
    if timeout:
        text = "the test did not finish in time (an endless loop, or far too slow)"
    return {
        "message": _shorten(summarize_reprs(text)),
        "sentinel": sentinel,
        "standin": standin,
        "where": None if timeout else _learner_frame(chain),
        "timeout": timeout,
    }


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


def _bare_assert(exc: AssertionError) -> str:
    """An assert without a message that pytest did not rewrite: in the engine, the learner's code or
    a test helper. Its line says what was expected."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "AssertionError (without a message)"
    f = frames[-1]
    # its "in your code" line says where
    learners = _judge is not None and f.filename in _judge.labels
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


@pytest.hookimpl(tryfirst=True)
def pytest_assertrepr_compare(config, op: str, left: Any, right: Any):
    """Under the judge, a failed comparison is one line: both sides in brief, and for two
    sequences where they first differ (instead of pytest's full diff and reprs)."""
    if _judge is None:
        return None
    line = f"{brief(left)} {op} {brief(right)}"
    if (
        op == "=="
        and isinstance(left, (list, tuple, str))
        and isinstance(right, (list, tuple, str))
    ):
        i = next((i for i, (a, b) in enumerate(zip(left, right)) if a != b), None)
        if i is not None:
            return [line, f"{DETAIL_PREFIX} at index {i}, {brief(left[i])} != {brief(right[i])}"]
        if len(left) != len(right):
            return [line, f"{DETAIL_PREFIX} lengths {len(left)} and {len(right)}"]
    return [line]


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


def _chain(exc: BaseException) -> List[BaseException]:
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


def _raised_in_learner_code(exc: BaseException) -> bool:
    """Whether the innermost frame of `exc` is the learner's code (not the engine's or a test's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return _judge is not None and bool(frames) and frames[-1].filename in _judge.labels


def _learner_frame(chain: List[BaseException]) -> str | None:
    """The innermost line of learner code in the traceback: where the learner should look.
    Written `<label>, line N, in <function>: <code>`; when that function is a helper rather than an
    exercise, ` (called from <exercise function>)` follows the function's name (the innermost
    exercise frame around it), so the report can show the line under the exercise it belongs to
    (judging.where_owner reads it back)."""
    if _judge is None:
        return None
    attrs = {e.attr for u in _judge.spec.units for e in u.exercises}
    for exc in chain:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in _judge.labels]
        if frames:
            f = frames[-1]
            line = (f.line or "").strip()
            where = f"{f.filename}, line {f.lineno}, in {f.name}"
            if f.name not in attrs:
                caller = next((g.name for g in reversed(frames) if g.name in attrs), None)
                where += f" (called from {caller})" if caller else ""
            return where + (f": {line[:100]}" if line else "")
    return None


def _shorten(
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
