"""The judge's pytest plugin (`pytest -p judge.plugin`), active only when MINISGL_JUDGE_SPEC names a
spec file (written by runner.py).

At `pytest_configure` it swaps the learner's functions in (swap.py). As the tests run it appends one
JSON line per event to the spec's results file, flushed at once, so that what happened survives a
test that ends the process (`os._exit`, a crash, a kill on timeout):

    {"event": "swapped", "problems": {...}, "general": [...]}
    {"event": "collected", "tests": [nodeid, ...]}
    {"event": "collect_error", "where": ..., "message": ...}
    {"event": "start", "test": nodeid}
    {"event": "result", "test": nodeid, "outcome": "passed|failed|error|skipped|timeout", "duration": s,
     "message": ..., "sentinel": "chNN.name" | null, "standin": bool, "where": "cell 3, line 4: ..." | null}
    {"event": "finished"}
    {"event": "fatal", "message": ...}          nothing can be judged here (e.g. --device cuda, no GPU)
"""

from __future__ import annotations

import json
import os
import re
import traceback
from pathlib import Path
from typing import Any, Dict, List

import pytest

SPEC_ENV = "MINISGL_JUDGE_SPEC"
SENTINEL = re.compile(r"^(ch\d\d\.\w+):")
MAX_MESSAGE = 1500
MAX_LINES = 10


class _Judge:
    def __init__(self, spec_path: str) -> None:
        self.spec: Dict[str, Any] = json.loads(Path(spec_path).read_text())
        self.results = open(self.spec["results"], "a", encoding="utf-8")
        self.labels = {s["label"] for u in self.spec.get("units", []) for s in u["snippets"]}
        self.test_dirs = [str(Path(d)) for d in self.spec.get("test_dirs", [])]
        self.skip = set(self.spec.get("done", []))  # tests of an earlier, interrupted run
        self.reports: Dict[str, List[pytest.TestReport]] = {}

    def write(self, record: Dict[str, Any]) -> None:
        self.results.write(json.dumps(record) + "\n")
        self.results.flush()


_judge: _Judge | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _judge
    path = os.environ.get(SPEC_ENV)
    if not path or _judge is not None:
        return
    _judge = _Judge(path)
    if _judge.spec.get("device") == "cuda" and not _cuda_available():
        _judge.write({"event": "fatal", "message": "--device cuda, but there is no usable CUDA GPU here "
                                                   "(use --device cpu, or auto)"})
        pytest.exit("no CUDA GPU", returncode=4)
    from . import swap

    report = swap.apply_spec(_judge.spec, _judge.test_dirs)
    _judge.write({"event": "swapped", "problems": report.problems, "general": report.general})


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(session, config, items) -> None:
    if _judge is None or not _judge.skip:
        return
    keep = [i for i in items if i.nodeid not in _judge.skip]
    dropped = [i for i in items if i.nodeid in _judge.skip]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    if _judge is None:
        return
    from . import swap

    swap.rescan(_judge.spec, _judge.test_dirs)  # test modules hold module-level functions too
    _judge.write({"event": "collected", "tests": [item.nodeid for item in session.items]})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _judge is not None and report.failed:
        text = str(report.longrepr)
        _judge.write({"event": "collect_error", "where": report.nodeid or "(collection)",
                      "message": _shorten(text, keep_end=True)})


def pytest_runtest_logstart(nodeid: str, location) -> None:
    if _judge is not None:
        _judge.write({"event": "start", "test": nodeid})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if _judge is not None and call.excinfo is not None:
        report._judge_info = _describe(call.excinfo)  # type: ignore[attr-defined]


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
        _judge.write({"event": "finished"})


# ---------------------------------------------------------------------- describing outcomes


def _final_record(nodeid: str, phases: List[pytest.TestReport]) -> Dict[str, Any]:
    record: Dict[str, Any] = {"event": "result", "test": nodeid, "outcome": "passed",
                              "duration": round(sum(p.duration for p in phases), 3),
                              "message": None, "sentinel": None, "standin": False, "where": None}
    bad = next((p for p in phases if p.failed), None)
    if bad is None:
        if any(p.skipped for p in phases):
            skip = next(p for p in phases if p.skipped)
            record["outcome"] = "skipped"
            if isinstance(skip.longrepr, tuple) and len(skip.longrepr) == 3:
                record["message"] = str(skip.longrepr[2]).removeprefix("Skipped: ")
        return record
    info = getattr(bad, "_judge_info", None) or {"message": _shorten(str(bad.longrepr), keep_end=True)}
    record.update(info)
    if info.get("timeout"):
        record["outcome"] = "timeout"
    elif bad.when == "call":
        record["outcome"] = "failed"
    else:
        record["outcome"] = "error"  # a fixture (setup/teardown) failed
    record.pop("timeout", None)
    return record


def _describe(excinfo: pytest.ExceptionInfo) -> Dict[str, Any]:
    from .swap import LearnerCodeError

    exc = excinfo.value
    chain = _chain(exc)
    sentinel = next((m.group(1) for e in chain if isinstance(e, NotImplementedError)
                     for m in [SENTINEL.match(str(e))] if m), None)
    standin = any(isinstance(e, LearnerCodeError) for e in chain)
    if isinstance(exc, AssertionError):
        message = excinfo.exconly()
    elif sentinel or standin:
        message = str(next(e for e in chain if isinstance(e, (NotImplementedError, LearnerCodeError))))
        message = f"{'NotImplementedError' if sentinel else 'LearnerCodeError'}: {message}"
    else:
        message = excinfo.exconly()
    text = message
    timeout = isinstance(exc, BaseException) and "Timeout" in text and "pytest-timeout" in text
    if timeout:
        text = "the test did not finish in time (an endless loop, or far too slow)"
    return {"message": _shorten(text), "sentinel": sentinel, "standin": standin,
            "where": None if timeout else _learner_frame(chain), "timeout": timeout}


def _chain(exc: BaseException) -> List[BaseException]:
    out: List[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _learner_frame(chain: List[BaseException]) -> str | None:
    """The innermost line of learner code in the traceback: where the learner should look."""
    if _judge is None:
        return None
    for exc in chain:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in _judge.labels]
        if frames:
            f = frames[-1]
            line = (f.line or "").strip()
            return f"{f.filename}, line {f.lineno}, in {f.name}" + (f": {line[:100]}" if line else "")
    return None


def _shorten(text: str, keep_end: bool = False) -> str:
    lines = [ln for ln in text.rstrip().splitlines() if ln.strip() and "Use -v to get" not in ln]
    if len(lines) > MAX_LINES:
        cut = f"... ({len(lines) - MAX_LINES} more lines)"
        lines = ([cut] + lines[-MAX_LINES:]) if keep_end else (lines[:MAX_LINES] + [cut])
    text = "\n".join(lines)
    if len(text) > MAX_MESSAGE:
        text = ("..." + text[-MAX_MESSAGE:]) if keep_end else (text[:MAX_MESSAGE] + "...")
    return text
