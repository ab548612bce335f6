"""CPU time of one scheduler step in decode, at 1 and 32 requests, on the bundled model: the whole
step, and the part outside the model's forward (batch building, metadata, sampling, result
handling). CPU time (time.process_time), not wall time, so other programs on the machine disturb
it less; the median of many steps.

    python benchmarks/step_cost.py                 # default settings (overlap loop)
    python benchmarks/step_cost.py --profile 32    # and a cProfile of 200 steps at 32 requests
    python benchmarks/step_cost.py --prompt-len 256  # longer contexts: attention's share grows
    python benchmarks/step_cost.py --floor         # and the step's matrix products alone

`--floor` times what no scheduler or kernel choice can remove from a decode step: its matrix
products, each of the engine's own weights (in the layout and at the threads the engine set) times
a batch of rows, one pass over all of them a step, as the forward makes them. The rest of the step
is calling the other operators and the scheduler's work.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's minisgl

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from minisgl import LLM, SamplingParams  # noqa: E402


def decode_steps(llm: LLM, n: int, steps: int, profile: bool = False, prompt_len: int = 8):
    """(whole step, outside the forward) CPU milliseconds, medians over `steps` decode steps."""
    params = SamplingParams(max_tokens=steps + 16, ignore_eos=True)
    for i in range(n):
        llm.add_request([1 + (i * 7 + j) % 200 for j in range(prompt_len + i % 5)], params)
    forward_ms = []
    run_model = llm.engine.run_model

    def timed(batch):
        t = time.process_time()
        out = run_model(batch)
        forward_ms.append((time.process_time() - t) * 1e3)
        return out

    llm.engine.run_model = timed
    for _ in range(4):  # prefill, and the first decode steps
        llm.step()
    whole, outside = [], []
    prof = cProfile.Profile() if profile else None
    for _ in range(steps):
        forward_ms.clear()
        t = time.process_time()
        if prof is not None:
            prof.enable()
        llm.step()
        if prof is not None:
            prof.disable()
        ms = (time.process_time() - t) * 1e3
        whole.append(ms)
        outside.append(ms - sum(forward_ms))
    llm.engine.run_model = run_model
    while llm.busy:
        llm.step()
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    return statistics.median(whole), statistics.median(outside)


def products_ms(llm: LLM, n: int, passes: int = 100) -> float:
    """CPU milliseconds of one pass of `n`-row products over every weight the forward multiplies
    by (the layers' projections, the LM head: the tied embedding), the median of `passes`."""
    weights = [t for _, t in llm.engine.model.named_tensors() if t.dim() == 2]
    rows = {w.shape[1]: torch.randn(n, w.shape[1], dtype=w.dtype) for w in weights}
    times = []
    for i in range(passes + 5):
        t = time.process_time()
        for w in weights:
            F.linear(rows[w.shape[1]], w)
        if i >= 5:  # the first passes warm the caches and the BLAS
            times.append((time.process_time() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--profile", type=int, default=None, help="cProfile the steps at this batch")
    ap.add_argument("--prompt-len", type=int, default=8, help="tokens a prompt (plus 0-4)")
    ap.add_argument("--floor", action="store_true", help="also the step's matrix products alone")
    args = ap.parse_args()
    llm = LLM(max_running_req=max(args.batches))
    decode_steps(llm, 2, 8)  # warm-up
    head = f"{'requests':>8} {'step CPU ms':>12} {'outside forward ms':>19}"
    print(head + (f" {'products alone ms':>18} {'their share':>11}" if args.floor else ""))
    for n in args.batches:
        whole, outside = decode_steps(llm, n, args.steps, args.profile == n, args.prompt_len)
        line = f"{n:>8} {whole:>12.2f} {outside:>19.2f}"
        if args.floor:
            floor = products_ms(llm, n)
            line += f" {floor:>18.2f} {floor / whole:>10.0%}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
