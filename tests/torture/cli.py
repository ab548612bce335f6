"""The long profile: run seeded workloads for a number of workloads or minutes, shrink each new kind
of failure to a minimal workload, and print the figures.

  python -m tests.torture --minutes 3            # seeds 0, 1, 2, ... until three minutes are up
  python -m tests.torture --workloads 10000 --seed 5000
  python -m tests.torture --replay .cache/torture/<file>.json   # rerun one saved workload
  python -m tests.torture --variant ch11_upstream_slot --workloads 50   # a wrong variant: must fail
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path
from typing import Dict

import torch

from helpers import MODEL, REPO

from .prompts import load_pool
from .runner import run_workload
from .shrink import shrink
from .workload import Workload, generate

SAVE_DIR = REPO / ".cache" / "torture"


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m tests.torture",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--workloads", type=int, default=None, help="stop after this many workloads")
    ap.add_argument("--minutes", type=float, default=None, help="stop after this much wall time")
    ap.add_argument("--seed", type=int, default=0, help="first seed (the others follow it)")
    ap.add_argument("--max-requests", type=int, default=10, help="requests per workload, at most")
    ap.add_argument(
        "--shrink-budget", type=int, default=400, help="runs the shrinker may spend per failure"
    )
    ap.add_argument(
        "--max-failures", type=int, default=5, help="stop after this many failing workloads"
    )
    ap.add_argument(
        "--replay", type=Path, default=None, help="run one workload saved as JSON, then stop"
    )
    ap.add_argument(
        "--variant",
        default=None,
        help="run a known-wrong scheduler variant (judge/variants/NAME.diff or .py) instead of the "
        "reference",
    )
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.workloads is None and args.minutes is None and args.replay is None:
        args.minutes = 3.0
    return args


def _replay(args, pool, llm_class) -> int:
    wl = Workload.from_json(args.replay.read_text())
    result = run_workload(wl, pool, args.model, args.device, llm_class)
    print(
        f"replayed seed {wl.seed}: {result.transcript.iterations} steps, {result.aborts} aborts: "
        f"{result.failure or 'ok'}"
    )
    return 1 if result.failure else 0


def main(argv=None) -> int:
    args = _parse(argv)
    torch.set_num_threads(1)  # tiny models: more threads only fight over a shared machine's cores
    pool = load_pool(args.model)
    llm_class = None
    if args.variant is not None:
        from test_ch11_variants import variant_llm

        llm_class = variant_llm(args.variant)
    if args.replay is not None:
        return _replay(args, pool, llm_class)
    start = time.monotonic()
    deadline = start + 60 * args.minutes if args.minutes is not None else float("inf")
    done = iterations = launches = 0
    abort_states: Counter = Counter()
    failures: Dict[str, list] = {}
    seed = args.seed
    while (args.workloads is None or done < args.workloads) and time.monotonic() < deadline:
        wl = generate(seed, pool, args.max_requests)
        result = run_workload(wl, pool, args.model, args.device, llm_class)
        done += 1
        iterations += result.transcript.iterations
        launches += result.transcript.launches
        abort_states.update(result.transcript.abort_states)
        if result.failure is not None:
            kind = result.failure.kind
            print(f"seed {seed}: FAIL {result.failure}", flush=True)
            failures.setdefault(kind, []).append(seed)
            if len(failures[kind]) == 1:  # shrink the first failure of each kind
                small, runs = shrink(
                    wl, kind, pool, args.model, args.shrink_budget, args.device, llm_class
                )
                SAVE_DIR.mkdir(parents=True, exist_ok=True)
                path = SAVE_DIR / f"{kind.replace(':', '-')}-seed{seed}.json"
                path.write_text(small.to_json())
                print(
                    f"  shrunk in {runs} runs to {len(small.requests)} request(s), "
                    f"{len(small.aborts)} abort(s):\n"
                    f"  {small.to_json()}\n  replay: python -m tests.torture --replay {path}"
                    f"{' --variant ' + args.variant if args.variant else ''}",
                    flush=True,
                )
            if sum(len(v) for v in failures.values()) >= args.max_failures:
                break
        seed += 1
        if done % 100 == 0:
            print(
                f"... {done} workloads, {iterations} steps, {sum(abort_states.values())} aborts, "
                f"{time.monotonic() - start:.0f}s",
                flush=True,
            )
    elapsed = time.monotonic() - start
    print(
        f"ran {done} workloads (seeds {args.seed}..{args.seed + done - 1}) in {elapsed:.0f}s: "
        f"{iterations} steps, {launches} batches, {sum(abort_states.values())} aborts "
        f"({', '.join(f'{k} {v}' for k, v in sorted(abort_states.items()))})"
    )
    if failures:
        for kind, seeds in failures.items():
            print(f"FAILED [{kind}]: {len(seeds)} workload(s), seeds {seeds[:10]}")
        return 1
    print("no failures")
    return 0
