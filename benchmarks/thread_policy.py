"""The measurements behind minisgl's thread policy (minisgl/utils/threads.py): LLM.generate's
tokens per second for each torch thread count, at 1 and 32 requests, on an idle machine and beside
a competing CPU-bound process, each run in a fresh process (a process's inter-op threads can be set
only once).

    python benchmarks/thread_policy.py                          # the bundled model
    python benchmarks/thread_policy.py --model DIR --new-tokens 16 --threads 1 2

Run it with OMP_NUM_THREADS unset: each child sets its threads through MINISGL_THREADS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's minisgl, not an installed one

CHILD = """
import json, sys, time
from minisgl import LLM, SamplingParams
import torch
model, n, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = LLM(model, max_running_req=max(32, n))
prompts = [[1 + (i * 7 + j) % 200 for j in range(8 + i % 5)] for i in range(n)]
p = SamplingParams(max_tokens=new, ignore_eos=True)
llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
best = 0.0
for _ in range(2):
    t = time.perf_counter()
    llm.generate(prompts, p)
    best = max(best, n * new / (time.perf_counter() - t))
print(json.dumps({"tps": best, "threads": torch.get_num_threads(),
                  "interop": torch.get_num_interop_threads()}))
"""


def run_child(model: str, n: int, new: int, threads: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["MINISGL_THREADS"] = threads
    env["MINISGL_PROGRESS"] = "off"
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(n), str(new)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from minisgl.models import BUNDLED_MODEL

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(BUNDLED_MODEL))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--threads", nargs="+", default=["1", "2"])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"model {Path(args.model).name}, {args.new_tokens} tokens a request, load {load}")
    print(f"{'busy':>5} {'requests':>8} " + " ".join(f"{'threads=' + t:>12}" for t in args.threads))
    for busy in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            time.sleep(0.5 if busy else 0)
            for n in args.batches:
                best = {t: 0.0 for t in args.threads}
                for _ in range(args.repeat):  # interleaved, so a disturbance hits every setting
                    for t in args.threads:
                        best[t] = max(best[t], run_child(args.model, n, args.new_tokens, t)["tps"])
                cells = " ".join(f"{best[t]:>8.1f} t/s" for t in args.threads)
                print(f"{'yes' if busy else 'no':>5} {n:>8} {cells}", flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()


if __name__ == "__main__":
    main()
