"""Per-test time budgets, from the reference's own measured times (`judge/budgets.json`).

A test's budget is what the learner's code may spend in it before the test is stopped as a timeout:
`max(floor, factor x the reference's time)`, or `default` for a test the file has no time for (a
new test); and `wait` seconds of wall time blocked in the learner's code without computing. The
reference's time is the test process's CPU time in the test, which a busy machine stretches much
less than its wall time; the factor leaves room for load and a slower machine. Only
time spent in the engine (the package the chapter's exercises belong to, e.g. `minisgl`) and in the
learner's code counts (timer.py samples the stack): the tests' own Hugging Face reference
computations and a cold cache are not held against the learner. `--timeout` stays a hard cap on the
test's whole wall time.

The times are measured on the reference and kept next to the registry (`budgets.json` beside
`exercises.toml`), per device:

    python -m judge.measure_budgets               # every chapter on cpu, write judge/budgets.json
    python -m judge.measure_budgets ch09 ch11     # only these chapters (the others' are kept)
    python -m judge.measure_budgets --device cuda # the GPU's column (without: `default` on a GPU)

(the measuring is judge/measure_budgets.py: it runs the judge, which reads the budgets here.)

A stale file is noticed: a reference run (`python judge.py chNN --solution`, the self-check's
reference check) fails when the reference's code itself spends more than a test's budget.
Only the standard library is used here: the judge's parent process reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Sequence

from .protocol import BudgetSpec
from .registry import DEFAULT_REGISTRY
from .settings import REGISTRY

# Used where the file does not say otherwise (the file may set "floor", "factor", "default").
# seconds: even a test the reference runs in 20 ms gets this much. The same on a GPU: its measured
# times hold a test's own warm-up (its graphs' capture), compiling kernels is not counted, and the
# process's one-off start (CUDA context, first graph, Triton's key) comes before its first test
# (device_warmup.py), in no test's time.
FLOOR = {
    "cpu": 5.0,
    "cuda": 5.0,
}
FACTOR = 10.0  # x the reference's time: slow but correct code (a Python loop, a busy laptop) passes
# A test with no measured time yet. On a GPU, until its times are measured, the old flat timeout:
# its first runs compile Triton kernels and warm up CUDA, which the CPU's times know nothing of.
DEFAULT = {"cpu": 30.0, "cuda": 120.0}
# Learner code that waits (a recv, a queue's get or a wait with no timeout, a sleep) spends no CPU,
# so no CPU budget stops it: wall seconds in which it is on the stack blocked count against this
# (or the test's budget, if longer), not against the minute of the hard cap. No reference
# exercise waits that long in a test.
WAIT = 10.0
# Not the engine's time even when the engine called them: compiling kernels, Hugging Face; and a
# test's live server starting and stopping (other processes do that work: this one only waits).
NOT_COUNTED = ["triton", "transformers", "minisgl.server.background"]
# The file's "first_test" (per device and test file, written by measure_budgets): what a process's
# first test spends beyond its own work (the first engine built in a process: CUDA's lazily loaded
# kernels, the caching allocator's first blocks, the first graphs). Every test's time is measured
# without it, and the first test a process runs gets its file's on top of its budget once, not
# times the factor: it is the same for a learner's code as for the reference's. Left in, it was 10x
# in the first test's budget (ch11 on cuda: 11.1 s where a later place gives 5 s), and a learner's
# endless loop there ran that long before it was stopped.


def path() -> Path:
    """The budgets file that goes with the registry in use."""
    registry = Path(REGISTRY.read() or DEFAULT_REGISTRY)
    return registry.with_name("budgets.json")


def device_key(device: str) -> str:
    """Whose times apply: "auto" is the GPU's where this machine has an NVIDIA GPU (its device
    files: this process imports no torch), else the CPU's."""
    if device == "auto":
        return "cuda" if _has_nvidia_gpu() else "cpu"
    return "cpu" if device == "cpu" else "cuda"


def _has_nvidia_gpu() -> bool:
    dev = Path("/dev")
    return (dev / "nvidiactl").exists() or (dev / "dxg").exists()  # Linux; WSL2


def load(file: Path | None = None) -> Dict:
    try:
        data = json.loads((file or path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def test_key(nodeid: str) -> str:
    """'tests/test_x.py::test_y[a]' -> 'test_x.py::test_y[a]' (as the registry names tests)."""
    file, _, rest = nodeid.partition("::")
    return f"{Path(file).name}::{rest}"


class Budgets:
    """The budget of each test on one device."""

    def __init__(self, data: Dict, device: str, hard: float) -> None:
        key = device_key(device)
        times = data.get("times", {})
        self.measured: Dict[str, float] = dict(times.get(key) or {})
        self.floor = float(data.get("floor", {}).get(key, FLOOR[key]))
        self.factor = float(data.get("factor", FACTOR))
        self.default = float(data.get("default", {}).get(key, DEFAULT[key]))
        self.first_test: Dict[str, float] = dict(data.get("first_test", {}).get(key) or {})
        self.wait = float(data.get("wait", WAIT))
        self.hard = hard

    def spec(self, packages: Sequence[str]) -> BudgetSpec:
        """What the test process needs (timer.py); the running time of `packages` counts."""
        return BudgetSpec(
            measured=self.measured,
            floor=self.floor,
            factor=self.factor,
            default=self.default,
            hard=self.hard,
            wait=self.wait,
            not_counted=list(NOT_COUNTED),
            packages=list(packages),
            first_test=self.first_test,
        )
