"""Benchmark the judge end to end (not a test): `python judge.py chNN ...` as a learner runs it,
for the kinds of code a learner hands in.

    python tools/bench_judge.py [--repeat 1] [--chapter ch11] [--device cpu] [--only hang,raises]

Cases (ch11; another chapter gets the cases that need no ch11 code):
  solution       --solution: the reference
  notebook       the untouched learner notebook (every exercise still its stub)
  wrong          one wrong exercise in a file (the variant ch11_upstream_finished, applied)
  wrong-of-4     all four exercises handed in, _process_last_data the wrong one (blame reruns)
  hang           overlap_loop is `while True: pass`
  hang-of-4      all four handed in, overlap_loop the endless one
  raises         _process_last_data raises
  cumulative     --solution --cumulative (chapters 0..N together)

Prints wall time and CPU time (user + sys of the judge and every process it waited for: the test
process, the fork server and its children) per run. On a shared machine the wall time depends on
the load; the CPU time much less. The first run may include the tests' one-off Hugging Face
reference computation (cached in .cache/hf_ref afterwards). Progress is written to a temporary
file, never to the checkout's .judge_progress.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

HANG = "def overlap_loop(self, last_data):\n    while True:\n        pass\n"
RAISES = "def _process_last_data(self, last_data):\n    raise ValueError('boom')\n"


def run(argv, env):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "judge.py", *argv, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        verdict = json.loads(proc.stdout)
        counts = verdict["counts"]
        status = ", ".join(
            f"{e['name']} {e['status']}"
            for e in verdict["exercises"]
            if e["status"] not in ("reference",)
        )
        tests = (
            f"{counts.get('passed', 0)}/{len(verdict['tests'])} passed"
            + ("".join(f", {n} {k}" for k, n in counts.items() if k != "passed"))
            + (f"; {status}" if status else "")
        )
    except (ValueError, KeyError):
        tests = f"no verdict (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"
    return wall, cpu, tests


def all_four(chapter: str, replace: dict) -> str:
    """Every exercise of the chapter as the reference has it, some replaced: a finished notebook."""
    from judge import stubs

    parts = [
        replace.get(e.name) or stubs.reference_source(chapter, e.name)
        for e in stubs.exercises(chapter)
    ]
    return "\n\n".join(parts) + "\n"


def cases(chapter: str, tmp: Path):
    from judge.variant_edits import variant_path, variant_source

    files = {}

    def write(name, text):
        files[name] = tmp / f"{name}.py"
        files[name].write_text(text)
        return str(files[name])

    out = [("solution", [chapter, "--solution"]), ("notebook", [chapter])]
    if chapter == "ch11":
        wrong = variant_source(variant_path("ch11_upstream_finished"))
        out += [
            ("wrong", [chapter, "--file", write("wrong", wrong)]),
            (
                "wrong-of-4",
                [
                    chapter,
                    "--file",
                    write("wrong4", all_four(chapter, {"process_last_data": wrong})),
                ],
            ),
            ("hang", [chapter, "--file", write("hang", HANG)]),
            (
                "hang-of-4",
                [chapter, "--file", write("hang4", all_four(chapter, {"overlap_loop": HANG}))],
            ),
            ("raises", [chapter, "--file", write("raises", RAISES)]),
        ]
    out.append(("cumulative", [chapter, "--solution", "--cumulative"]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--chapter", default="ch11")
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = p.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs, load average {load:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp:
        env = dict(os.environ, MINISGL_JUDGE_PROGRESS=str(Path(tmp) / "progress.json"))
        only = {c for c in args.only.split(",") if c}
        for label, argv in cases(args.chapter, Path(tmp)):
            if only and label not in only:
                continue
            for i in range(args.repeat):
                wall, cpu, tests = run([*argv, "--device", args.device], env)
                print(
                    f"{label:11} run {i + 1}: wall {wall:6.1f} s   cpu {cpu:6.1f} s   {tests}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
