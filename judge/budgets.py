"""Per-test time budgets, from the reference's own measured times (`judge/budgets.json`).

A test's budget is what the learner's code may spend in it before the test is stopped as a timeout:
`max(floor, factor x the reference's time)`, or `default` for a test the file has no time for (a
new test). The reference's time is the test process's CPU time in the test, which a busy machine
stretches much less than its wall time; the factor leaves room for load and a slower machine. Only
time spent in the engine (the package the chapter's exercises belong to, e.g. `minisgl`) and in the
learner's code counts (timer.py samples the stack): the tests' own Hugging Face reference
computations and a cold cache are not held against the learner. `--timeout` stays a hard cap on the
test's whole wall time.

The times are measured on the reference and kept next to the registry (`budgets.json` beside
`exercises.toml`), per device:

    python -m judge.budgets                 # measure every chapter on cpu, write judge/budgets.json
    python -m judge.budgets ch09 ch11       # only these chapters (the others' times are kept)
    python -m judge.budgets --device cuda   # the GPU's column (without it: `default` on a GPU)

A stale file is noticed: a reference run (`python judge.py chNN --solution`, the self-check's
reference check) fails when the reference's code itself spends more than a test's budget.
Only the standard library is used here: the judge's parent process reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from .protocol import BudgetSpec
from .registry import DEFAULT_REGISTRY
from .settings import REGISTRY

# Used where the file does not say otherwise (the file may set "floor", "factor", "default").
# seconds: even a test the reference runs in 20 ms gets this much
FLOOR = {
    "cpu": 5.0,
    "cuda": 10.0,
}
FACTOR = 10.0  # x the reference's time: slow but correct code (a Python loop, a busy laptop) passes
# A test with no measured time yet. On a GPU, until its times are measured, the old flat timeout:
# its first runs compile Triton kernels and warm up CUDA, which the CPU's times know nothing of.
DEFAULT = {"cpu": 30.0, "cuda": 120.0}
# Not the engine's time even when the engine called them: compiling kernels, Hugging Face.
NOT_COUNTED = ["triton", "transformers"]


def path() -> Path:
    """The budgets file that goes with the registry in use."""
    registry = Path(REGISTRY.read() or DEFAULT_REGISTRY)
    return registry.with_name("budgets.json")


def device_key(device: str) -> str:
    return "cpu" if device == "cpu" else "cuda"  # "auto" may be a GPU: the more generous numbers


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
        self.hard = hard

    def spec(self, packages: Sequence[str]) -> BudgetSpec:
        """What the test process needs (timer.py); the running time of `packages` counts."""
        return BudgetSpec(
            measured=self.measured,
            floor=self.floor,
            factor=self.factor,
            default=self.default,
            hard=self.hard,
            not_counted=list(NOT_COUNTED),
            packages=list(packages),
        )


# ---------------------------------------------------------------------- measuring


def measure(chapter_keys: List[str], device: str, repeat: int) -> int:
    from .judging import judge
    from .registry import load_registry
    from .runner import RunOptions

    registry = load_registry()
    chapters = (
        [registry.chapter(k) for k in chapter_keys]
        if chapter_keys
        else list(registry.chapters.values())
    )
    file = path()
    data = load(file)
    key = device_key(device)
    times: Dict[str, float] = dict(data.get("times", {}).get(key, {}))
    failed = False
    for chapter in chapters:
        best: Dict[str, float] = {}
        # The first run warms the caches (Hugging Face references, the page cache): not counted.
        for i in range(1 + max(1, repeat)):
            t0 = time.monotonic()
            verdict = judge([chapter], {}, RunOptions(device=device, budgets={}), mode="measure")
            bad = [t.test for t in verdict.tests if not t.ok]
            if verdict.general or bad or not verdict.tests:
                print(
                    f"{chapter.key}: the reference does not pass "
                    f"({'; '.join(verdict.general + bad)[:300]}); "
                    "its times are left as they were",
                    file=sys.stderr,
                )
                failed = True
                break
            if i == 0:
                continue
            for t in (
                verdict.tests
            ):  # CPU time (load stretches wall time); the largest of the counted runs
                spent = t.cpu if t.cpu is not None else t.duration
                best[test_key(t.test)] = max(best.get(test_key(t.test), 0.0), spent)
            print(
                f"{chapter.key}: run {i}: {len(verdict.tests)} tests, {time.monotonic() - t0:.1f} s"
            )
        if best:
            files = {f.name for f in chapter.test_files}
            # drop removed tests
            times = {k: v for k, v in times.items() if k.split("::")[0] not in files}
            times.update({k: round(v, 3) for k, v in best.items()})
    data["about"] = (
        "Each test's CPU time on the reference, in seconds, per device: the base of its time "
        "budget (judge/budgets.py). Written by `python -m judge.budgets`."
    )
    data.setdefault("times", {})[key] = dict(sorted(times.items()))
    file.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {file} ({len(times)} tests on {key})")
    return 1 if failed else 0


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m judge.budgets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("chapters", nargs="*", help="chapters to measure (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--repeat", type=int, default=2, help="counted runs per chapter; the slowest is kept"
    )
    args = p.parse_args(argv)
    return measure(args.chapters, args.device, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
