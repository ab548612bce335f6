"""Host work per generated token, plain decoding against speculative decoding (issue 47).

On a GPU the bundled 6-layer model's step is far below the launch floor: what a token costs is
the host's work, one Python-dispatched torch operator at a time (kernel launches, small copies,
index tensors), and a CUDA graph's replay counts as one. This counts the torch operators the host
dispatches outside graph replays, per generated token, at batch 1 on the CPU with emulated graphs
(the same code path a GPU takes, minus the device), for the plain engine and for speculation with
both drafters. It measures no time: the counts are exact and do not depend on the machine's load.

    python benchmarks/spec_host_ops.py [--k 4] [--new-tokens 64]

Speculation pays on such a model only if its operators per token (those of a whole verify cycle:
the draft's steps, the verify step, the handling of each accepted token, divided by the tokens the
cycle yields) come near the plain engine's.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from minisgl import LLM, SamplingParams
from minisgl.engine.graph_emulation import EmulatedGraph
from minisgl.models import BUNDLED_MODEL

DRAFT = "minisgl/assets/shakespeare-qwen3-draft"
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?"


class CountOps(TorchDispatchMode):
    """Counts every torch operator dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _replay_uncounted(replay):
    # a replay re-runs the captured operators on a CPU; on a GPU it is one launch
    def run(self):
        with _disable_current_modes():
            return replay(self)

    return run


def measure(options: dict, new_tokens: int) -> tuple:
    llm = LLM(BUNDLED_MODEL, device="cpu", use_cuda_graph=True, max_running_req=4, **options)
    prompt = llm.encode(PROMPT).tolist()
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))  # warm up
    if llm.drafter is not None:
        llm.spec_stats = type(llm.spec_stats)()
    with CountOps() as ops:
        llm.generate([prompt], params)
    verifies = llm.spec_stats.verifies if llm.drafter is not None else 0
    llm.shutdown()
    return ops.count, verifies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    EmulatedGraph.replay = _replay_uncounted(EmulatedGraph.replay)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"spec_host_ops {now}, torch {torch.__version__}, batch 1, {args.new_tokens} tokens")
    setups = {
        "plain, overlap loop": dict(overlap_scheduling=True),
        "plain, normal loop": dict(overlap_scheduling=False),
        f"prompt lookup, k={args.k}": dict(speculative="lookup", num_speculative_tokens=args.k),
        f"draft model, k={args.k}": dict(
            speculative="draft", draft_model=DRAFT, num_speculative_tokens=args.k
        ),
    }
    print(f"{'setup':24} {'ops':>7} {'verifies':>8} {'ops/token':>10} {'ops/verify':>11}")
    for name, options in setups.items():
        ops, verifies = measure(options, args.new_tokens)
        per_verify = f"{ops / verifies:11.0f}" if verifies else f"{'-':>11}"
        print(f"{name:24} {ops:7d} {verifies:8d} {ops / args.new_tokens:10.1f} {per_verify}")


if __name__ == "__main__":
    main()
