"""The judge's pytest plugin (`pytest -p judge.plugin`), active only when MINISGL_JUDGE_SPEC names a
spec file (a `protocol.RunSpec`, written by runner.py).

At `pytest_configure` it swaps the learner's functions in (swap.py). As the tests run it appends one
event (protocol.py: swapped, collected, collect_error, start, result, finished, fatal; timer.py adds
cpu_time and over_budget) per line to the spec's results file, flushed at once, so that what
happened survives a test that ends the process (`os._exit`, a crash, a kill on timeout).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from . import settings
from .failure_messages import DETAIL_PREFIX, brief, describe, final_record, shorten
from .protocol import (
    Collected,
    CollectError,
    Event,
    Fatal,
    Finished,
    RunSpec,
    Start,
    Swapped,
)

SPEC_ENV = settings.SPEC.name


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
    from .parent_death import die_with_parent

    die_with_parent()  # a fresh process (a forked one asked already): before the learner's code
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


@pytest.hookimpl(trylast=True)  # after -k and conftest deselect: the order is what will run
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
        _judge.write(CollectError(report.nodeid or "(collection)", shorten(text, keep_end=True)))


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
        info = info or describe(call.excinfo, _judge)
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
    _judge.write(final_record(report.nodeid, phases))
    del _judge.reports[report.nodeid]


def pytest_sessionfinish(session) -> None:
    if _judge is not None:
        _judge.write(Finished())


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
