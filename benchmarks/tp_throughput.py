"""Tensor parallelism on the CPU: tokens per second of the bundled model at TP=1, 2 and 4, and the
share of rank 0's time spent in collectives (gloo on the loopback interface).

    python benchmarks/tp_throughput.py [--tokens 64] [--batch 8] [--out FILE]

An honest figure: on a laptop's few cores every rank competes for the same cores, and the model is
small (5.8 M weights, 6 layers) so each all-reduce costs more than the matmul it follows. TP here
is a correctness lesson (the same tokens as TP=1), not a speed-up; it pays where a model does not
fit one GPU, or its matmuls are large enough to split.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from minisgl import LLM, SamplingParams


def measure(tp_size: int, batch: int, tokens: int) -> dict:
    llm = LLM(tp_size=tp_size, max_running_req=batch, num_page_override=4096)
    prompts = [f"ROMEO:\nBut soft, what light {i}" for i in range(batch)]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
    llm.generate(prompts, params)  # warm up
    comm = getattr(llm, "comm", None)
    if comm is not None:
        comm.reset_counts()
    start = time.perf_counter()
    out = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    generated = sum(len(o["token_ids"]) for o in out)
    row = dict(
        tp=tp_size,
        tok_s=generated / seconds,
        comm_share=(comm.seconds / seconds) if comm is not None else 0.0,
        all_reduces=comm.counts["all_reduce"] if comm is not None else 0,
        first=out[0]["token_ids"][:8],
    )
    llm.shutdown()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    rows = [measure(n, a.batch, a.tokens) for n in (1, 2, 4)]
    lines = [
        f"tensor parallelism, bundled model, CPU ({os.cpu_count()} cores), gloo; batch {a.batch}, "
        f"{a.tokens} tokens each, greedy, overlap on; "
        f"MINISGL_THREADS={os.environ.get('MINISGL_THREADS', '')}",
        "tp  tokens/s  time in collectives (rank 0)  all-reduces  same tokens as TP=1",
    ]
    for r in rows:
        lines.append(
            f"{r['tp']:<3} {r['tok_s']:8.1f}  {100 * r['comm_share']:27.1f} %  "
            f"{r['all_reduces']:11d}  {r['first'] == rows[0]['first']}"
        )
    text = "\n".join(lines)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
