"""One column of a milestone's table, in a process of its own: `python -m classroom.milestone_worker
JOB OUT` (classroom/milestone.py starts it).

The job names the part, the judge's swap spec (None: the reference) and the reference's column.
The workload runs in a forked child, so that the swap, which cannot be undone, touches only that
child, and a child that never ends is stopped. When the learner's run raises, stops, or gives
other tokens than the reference, the exercise to blame is looked for: the learner's line in the
traceback where there is one (the judge's `learner_frame`), else probes, each a child with a part
of the learner's code swapped in alone: each chapter's exercises, then, in a chapter that changes
the outcome, each of its exercises.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sys
import time
import traceback
from types import SimpleNamespace
from typing import Callable, List

from judge.protocol import RunSpec, UnitSpec

SENTINEL = re.compile(r"(ch\d\d\.\w+): (.*)")
REFERENCE_S = 600.0  # the reference's run takes seconds; this bounds only a broken workbook
# The learner's run, and each probe, may take this many times the reference's own time, and at
# least LEARNER_MIN_S: a run that does not end by then never will (a loop that does not advance).
LEARNER_FACTOR = 5
LEARNER_MIN_S = 30.0


def in_child(fn: Callable[[], dict], timeout: float) -> dict:
    """`fn()` in a forked child, its result back through a pipe; an error or a timeout as
    {"error": ...}."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            data = fn()
        except BaseException as e:  # noqa: BLE001 - reported, whatever it is
            data = {"error": described(e)}
        with os.fdopen(write, "wb") as f:
            f.write(json.dumps(data).encode())
        os._exit(0)
    os.close(write)
    chunks: List[bytes] = []
    deadline = time.monotonic() + timeout
    with os.fdopen(read, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([f], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                stop_servers()  # a server the child started outlives it (its own session)
                return {"error": f"it did not finish in {timeout:.0f} s (a loop that never ends?)"}
            chunk = os.read(f.fileno(), 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"error": f"the process died (exit status {status})"}
    return json.loads(b"".join(chunks))


def stop_servers() -> None:
    """Kill what is left of the servers a child started (milestone_workloads.started_servers lists
    them): a child killed at its time limit could not stop its own."""
    from classroom.milestone_workloads import started_servers

    for pid in started_servers():
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone


def described(e: BaseException) -> str:
    """An error in one line: a request the engine failed says so itself (milestone_workloads.py)."""
    from classroom.milestone_workloads import RequestFailed

    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text if isinstance(e, RequestFailed) else f"{type(e).__name__}: {text}"[:300]


def swapped_run(units: List[UnitSpec], workload: Callable[[], dict]) -> Callable[[], dict]:
    def go() -> dict:
        import tempfile

        from judge import swap
        from judge.settings import SPEC
        from minisgl.scheduler.lifecycle import RequestLifecycle

        # the processes this one starts (a server's, tensor-parallel ranks) swap in these too
        spec = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        spec.write(RunSpec(results=os.devnull, units=units).to_json())
        spec.close()
        os.environ[SPEC.name] = spec.name
        swap.apply(units)
        # A step that raises ends its requests with the error's text only (lifecycle.py); the
        # exception itself, with the learner's line in its traceback, is kept here.
        failed: List[BaseException] = []
        fail_batch = RequestLifecycle._fail_batch

        def keep(self, batch, error):
            failed.append(error)
            return fail_batch(self, batch, error)

        RequestLifecycle._fail_batch = keep
        try:
            return workload()
        except Exception as e:  # noqa: BLE001 - the learner's code may raise anything
            if failed and e.__cause__ is None:
                e.__cause__ = failed[0]
            error = described(e)
            # here, where the traceback still is (it does not cross the pipe)
            return {"error": error, "culprits": blame_from_error(e, error, units)}

    return go


def blame_from_error(exc: BaseException | None, error: str, units: List[UnitSpec]) -> List[str]:
    """The exercise a learner's error names: a stand-in's "chNN.name: why" (code that cannot run),
    or the learner's innermost line in the traceback, as the judge words it."""
    found = SENTINEL.search(error or "")
    ids = {e.id for u in units for e in u.exercises}
    if found and found.group(1) in ids:
        return [f"{found.group(1)}: {found.group(2)}"]
    if exc is None:
        return []
    from judge.failure_messages import learner_frame

    labels = {s.label: u for u in units for s in u.snippets}
    owner = {(u.chapter, s.label): s.exercise for u in units for s in u.snippets}
    causes = []
    while exc is not None and len(causes) < 10:
        causes.append(exc)
        exc = exc.__cause__ or exc.__context__
    learner = SimpleNamespace(labels=set(labels), spec=RunSpec(results="", units=units))
    where = learner_frame(causes, learner)
    if where is None:
        return []
    label = next((lab for lab in labels if where.startswith(lab + ",")), None)
    unit = labels.get(label)
    name = owner.get((unit.chapter, label)) if unit else None
    who = f"{unit.chapter}.{name}" if name else (unit.chapter if unit else "your code")
    return [f"{who} raised {error}; in your code: {where}"]


def probe(
    units: List[UnitSpec], workload, reference: dict, timeout: float, newest: str = ""
) -> List[str]:
    """The exercise that, swapped in alone, changes the outcome, found by halving: the learner's
    exercises split in two, each half put in alone (the rest the reference), the half that changes
    the outcome split again. A mistake shows this way when it needs no other exercise of the
    learner's to show; when neither half alone changes it, the set left is named together. The
    exercises of chapters after `newest` (this part's, the likeliest) are tried alone first: a
    probe of part 3 starts a server, and that saves several."""
    suspects = [e.id for u in units for e in u.exercises if e.swap]
    outcome = None
    recent = [s for s in suspects if s.split(".")[0] > newest]
    if newest and 0 < len(recent) < len(suspects):
        got = in_child(swapped_run(subset(units, recent), workload), timeout)
        if not _same(got, reference):
            suspects, outcome = recent, got
    while len(suspects) > 1:
        half = len(suspects) // 2
        for part in (suspects[:half], suspects[half:]):
            got = in_child(swapped_run(subset(units, part), workload), timeout)
            if not _same(got, reference):
                suspects, outcome = part, got
                break
        else:
            return [f"only these of yours together change it: {', '.join(suspects)}"]
    if not suspects:
        return []
    if outcome is None:  # the learner's only exercise: the full run was this one alone
        outcome = in_child(swapped_run(subset(units, suspects), workload), timeout)
    return [f"{suspects[0]}, put in alone, {_how(outcome, reference)}"]


def subset(units: List[UnitSpec], ids: List[str]) -> List[UnitSpec]:
    keep = set(ids)
    return [u.only(ids) for u in units if any(e.id in keep for e in u.exercises)]


def _same(got: dict, reference: dict) -> bool:
    return got.get("error") is None and got.get("checks") == reference.get("checks")


def _how(got: dict, reference: dict) -> str:
    if got.get("error"):
        return f"stops the run: {got['error']}"
    for name, want in reference.get("checks", {}).items():
        if got.get("checks", {}).get(name) != want:
            return f"changes {name}"
    return "changes the outcome"


def main(argv: List[str]) -> int:
    job = json.loads(open(argv[0]).read())
    import tempfile

    tempfile.tempdir = os.path.dirname(os.path.abspath(argv[1]))  # the parent removes it
    import torch

    from classroom.milestone_workloads import WORKLOADS

    torch.set_num_threads(1)  # a tiny model: more threads only add overhead on a shared CPU
    workload = WORKLOADS[job["part"]]
    reference = job.get("reference")
    if job.get("spec") is None:
        result = in_child(workload, REFERENCE_S)
    else:
        units = RunSpec.read(job["spec"]).units
        timeout = max(LEARNER_MIN_S, LEARNER_FACTOR * float(reference.get("seconds") or 0))
        result = in_child(swapped_run(units, workload), timeout)
        if not _same(result, reference) and not result.get("culprits"):
            newest = job.get("previous_part_ends", "")
            result["culprits"] = probe(units, workload, reference, timeout, newest)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # the worker's own failure: the parent says the process died, with this
        traceback.print_exc()
        sys.exit(3)
