"""Measure the reference's time in every test and write them to judge/budgets.json (the base of
each test's time budget: judge/budgets.py says how a budget follows from it).

    python -m judge.measure_budgets               # every chapter on cpu
    python -m judge.measure_budgets ch09 ch11     # only these chapters (the others' are kept)
    python -m judge.measure_budgets --device cuda # the GPU's column

Every test's time is taken where it is not the first test of its process: the counted runs alternate
between the collected order and one with the first test moved last, and the first test's time in
the collected order minus its time later is the process's one-off start, kept per device and test
file as "first_test" (budgets.py adds it to whichever test of that file a process runs first).

A module of its own because it runs the judge (judging.py, runner.py), which reads the budgets:
kept in budgets.py it would make an import circle.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Dict, List, Tuple

from .budgets import device_key, load, path, test_key
from .judging import judge
from .registry import load_registry
from .runner import RunOptions


def save(file, data: dict, key: str, times: Dict[str, float], first_test: Dict[str, float]) -> None:
    data["about"] = (
        "Each test's CPU time on the reference, in seconds, per device, where it is not the first "
        "test of its process: the base of its time budget (judge/budgets.py); first_test: what the "
        "first test of a process spends beyond that, per test file. Written by "
        "`python -m judge.measure_budgets`."
    )
    data.setdefault("times", {})[key] = dict(sorted(times.items()))
    data.setdefault("first_test", {})[key] = dict(sorted(first_test.items()))
    file.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _time_chapter(
    chapter, device: str, repeat: int
) -> Tuple[Dict[str, float], str, List[float], bool]:
    """The reference's tests of one chapter, timed: (each test's largest CPU time over the counted
    runs, the first collected test, its times as a process's first test, whether a run failed)."""
    failed = False
    best: Dict[str, float] = {}
    first, firsts = "", []  # the first collected test; its times as the process's first
    # The first run warms the caches (Hugging Face references, the page cache): not counted.
    # Then runs in the collected order (odd i) and with the first test moved last (even i).
    for i in range(1 + 2 * max(1, (repeat + 1) // 2)):
        t0 = time.monotonic()
        options = RunOptions(device=device, budgets={}, first_last=i > 0 and i % 2 == 0)
        verdict = judge([chapter], {}, options, mode="measure")
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
        for n, t in enumerate(verdict.tests):  # in run order: a measure run is one process
            # CPU time (load stretches wall time); the largest of the counted runs
            spent = t.cpu if t.cpu is not None else t.duration
            if n == 0:  # it started the process: its time is not its own
                if not options.first_last:
                    first = test_key(t.test)
                    firsts.append(spent)
                continue
            best[test_key(t.test)] = max(best.get(test_key(t.test), 0.0), spent)
        print(f"{chapter.key}: run {i}: {len(verdict.tests)} tests, {time.monotonic() - t0:.1f} s")
    return best, first, firsts, failed


def measure(chapter_keys: List[str], device: str, repeat: int) -> int:
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
    first_test: Dict[str, float] = dict(data.get("first_test", {}).get(key) or {})  # file -> s
    failed = False
    for chapter in chapters:
        best, first, firsts, chapter_failed = _time_chapter(chapter, device, repeat)
        failed = failed or chapter_failed
        if firsts and first in best:
            start = max(0.0, min(firsts) - best[first])
            print(f"{chapter.key}: a process's first test spends {start:.2f} s more")
            first_test[first.split("::")[0]] = round(start, 3)
        elif firsts:  # a chapter of one test: never timed later in a process, so with its start
            best[first] = max(firsts)
        if best:
            files = {f.name for f in chapter.test_files}
            # drop removed tests
            times = {k: v for k, v in times.items() if k.split("::")[0] not in files}
            times.update({k: round(v, 3) for k, v in best.items()})
            # written after each chapter: a long measurement cut short keeps what it measured
            save(file, data, key, times, first_test)
    print(f"wrote {file} ({len(times)} tests on {key})")
    return 1 if failed else 0


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m judge.measure_budgets",
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
