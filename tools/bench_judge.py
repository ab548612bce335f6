"""Benchmark the judge end to end (not a test): `python judge.py ch11 --solution`, and the same
with --cumulative, as a learner would run them.

    python tools/bench_judge.py [--repeat 3] [--chapter ch11] [--device cpu]

Prints wall time and CPU time (user + sys of the judge and its test process) per run. On a shared
machine the wall time depends on the load; the CPU time much less. The first run may include the
tests' one-off Hugging Face reference computation (cached in .cache/hf_ref afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "judge.py", *argv, "--json"], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        verdict = json.loads(proc.stdout)
        tests = f"{verdict['counts'].get('passed', 0)}/{len(verdict['tests'])} passed"
    except (ValueError, KeyError):
        tests = f"no verdict (exit {proc.returncode})"
    return wall, cpu, tests


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--chapter", default="ch11")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs, load average {load:.1f}")
    for label, extra in (("single chapter", []), ("cumulative", ["--cumulative"])):
        for i in range(args.repeat):
            wall, cpu, tests = run([args.chapter, "--solution", "--device", args.device, *extra])
            print(f"{label:15} run {i + 1}: wall {wall:6.1f} s   cpu {cpu:6.1f} s   {tests}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
