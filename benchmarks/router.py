"""Routers in front of several workers on a multi-tenant workload: how much prefill each saves.

    python benchmarks/router.py                       # 4 CPU workers, the bundled model
    python benchmarks/router.py --quick               # a smoke run
    python benchmarks/router.py --out benchmarks/results/DATE-cpu-router.txt
    python benchmarks/router.py --device cuda --workers 2   # 2 workers sharing one GPU

Tenants each have a long system prompt (--system-tokens, about; a sentence repeated) and ask short
questions; requests pick a tenant at random (fixed seed) and arrive as a Poisson process of --rate
per second. The same workload, under a fresh tag per router (so no router inherits another's
cached prefixes), goes through: minisgl's router on round_robin, minisgl's router on cache_aware,
and SGLang's router (`sglang-router`, the [router] extra) on cache_aware, if installed. Each
request is streamed with usage (httpx, in this process), greedy, `ignore_eos`, --max-tokens.

Figures per router: prefill tokens computed (the workers' /debug/scheduler `prefill_tokens`,
summed: prompt tokens their prefill batches ran, a cached prefix not), prompt tokens (usage),
cache hit rate (1 - computed / prompt), throughput (requests and output tokens per second over
first sent to last token), TTFT p50/p99 (sent to the first chunk with text; minisgl/bench).

With `--device cuda` every worker serves on the one GPU, in bfloat16. Left to size itself, a
server's KV pool takes a share (`memory_ratio`, 0.85) of the memory free when it starts: two
workers starting at once would each claim most of the card. `--num-pages` fixes each worker's pool
instead (CUDA_POOL_PAGES one-token pages: 192 MiB of KV for the bundled model), so any number
fits beside each other's CUDA graphs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import random
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Dict, List

import httpx

from minisgl.bench.stats import percentile
from minisgl.router.launch import (
    WORKER_ARGS,
    minisgl_router,
    prefill_tokens,
    sglang_router,
    start_workers,
    stop_all,
)

MODEL = "shakespeare-qwen3"
SENTENCE = (
    "You are the chorus of a play set in fair Verona, where two households, both alike in "
    "dignity, break to new mutiny from ancient grudge. "
)
SENTENCE_TOKENS = 42  # with the bundled model's tokenizer


def workload(tag: str, tenants: int, requests: int, system_tokens: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    repeat = max(1, system_tokens // SENTENCE_TOKENS)
    systems = [f"[{tag} tenant {t}] " + SENTENCE * repeat for t in range(tenants)]
    return [systems[rng.randrange(tenants)] + f"Question {i}: who speaks?" for i in range(requests)]


async def one(client, url: str, prompt: str, max_tokens: int, delay: float) -> Dict:
    await asyncio.sleep(delay)
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, first, usage = time.perf_counter(), None, None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"failed mid-stream: {chunk['error']['message']}")
            if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    return {"sent": sent, "ttft": first - sent, "done": time.perf_counter(), "usage": usage}


async def drive(url: str, prompts: List[str], rate: float, max_tokens: int, seed: int) -> List:
    rng, t, delays = random.Random(seed), 0.0, []
    for _ in prompts:
        delays.append(t)
        t += rng.expovariate(rate)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return await asyncio.gather(
            *[one(client, url, p, max_tokens, d) for p, d in zip(prompts, delays)]
        )


def measure(name: str, url: str, workers: List[str], prompts, args) -> Dict:
    before = prefill_tokens(workers)
    results = asyncio.run(drive(url, prompts, args.rate, args.max_tokens, args.seed))
    after = prefill_tokens(workers)
    computed = sum(after[w] - before[w] for w in workers)
    per_worker = [after[w] - before[w] for w in workers]
    prompt = sum(r["usage"]["prompt_tokens"] for r in results)
    output = sum(r["usage"]["completion_tokens"] for r in results)
    span = max(r["done"] for r in results) - min(r["sent"] for r in results)
    ttft = [r["ttft"] for r in results]
    return {
        "router": name,
        "prefill_computed": computed,
        "per_worker": per_worker,
        "prompt_tokens": prompt,
        "hit_rate": 1 - computed / prompt,
        "req_per_s": len(results) / span,
        "out_tok_per_s": output / span,
        "ttft_p50_ms": 1000 * percentile(ttft, 50),
        "ttft_p99_ms": 1000 * percentile(ttft, 99),
    }


def table(rows: List[Dict]) -> str:
    head = (
        f"{'router':<28}{'prefill computed':>17}{'prompt tokens':>14}{'hit rate':>9}"
        f"{'req/s':>7}{'out tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}  per worker"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['router']:<28}{r['prefill_computed']:>17}{r['prompt_tokens']:>14}"
            f"{r['hit_rate']:>9.1%}{r['req_per_s']:>7.2f}{r['out_tok_per_s']:>10.1f}"
            f"{r['ttft_p50_ms']:>8.0f}ms{r['ttft_p99_ms']:>8.0f}ms  {r['per_worker']}"
        )
    return "\n".join(lines)


CUDA_POOL_PAGES = 65536  # per worker, fixed: see the module's docstring
# on the GPU: more requests at once, bfloat16, a fixed pool (of a repeated flag the last wins)
CUDA_WORKER_ARGS = (
    "--device",
    "cuda",
    "--dtype",
    "bfloat16",
    "--num-pages",
    str(CUDA_POOL_PAGES),
    "--max-running-req",
    "32",
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where every worker runs: cpu (the default), or all of them sharing one GPU",
    )
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--tenants", type=int, default=6)
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--system-tokens", type=int, default=420)
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (Poisson)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 workers, 3 tenants, 12 requests")
    p.add_argument("--no-sglang", action="store_true", help="leave SGLang's router out")
    p.add_argument("--out", default=None, help="also write the figures to this file")
    args = p.parse_args()
    if args.quick:
        args.workers, args.tenants, args.requests = 2, 3, 12
    sglang = not args.no_sglang
    if sglang and importlib.util.find_spec("sglang_router") is None:
        print("sglang-router is not installed (pip install -e '.[router]'): left out")
        sglang = False
    gpu = args.device == "cuda"
    if gpu:
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device here")
    servers = start_workers(args.workers, *(CUDA_WORKER_ARGS if gpu else ()))
    urls = [s.url for s in servers]
    rows = []
    try:
        runs = [("minisgl round_robin", "round_robin"), ("minisgl cache_aware", "cache_aware")]
        if sglang:
            runs.append(("sglang-router cache_aware", "sglang"))
        for i, (name, policy) in enumerate(runs):
            prompts = workload(
                f"run {i}", args.tenants, args.requests, args.system_tokens, args.seed
            )
            with ExitStack() as stack:
                if policy == "sglang":
                    url = stack.enter_context(sglang_router(urls, "--policy", "cache_aware"))
                else:
                    url = stack.enter_context(minisgl_router(urls, "--policy", policy)).url
                rows.append(measure(name, url, urls, prompts, args))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        stop_all(servers)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if gpu:
        import torch

        where = (
            f"{args.workers} workers sharing one {torch.cuda.get_device_name()} (the bundled "
            f"model, bfloat16, a KV pool of {CUDA_POOL_PAGES} one-token pages each)"
        )
    else:
        pool = WORKER_ARGS[WORKER_ARGS.index("--num-pages") + 1]
        where = (
            f"{args.workers} CPU workers (the bundled model, float32, OMP_NUM_THREADS=1 each, a KV "
            f"pool of {pool} one-token pages)"
        )
    header = (
        f"# benchmarks/router.py, {when}; {platform.machine()}, {os.cpu_count()} cores, "
        f"{where}, {args.tenants} tenants, prompts of "
        f"{rows[0]['prompt_tokens'] / args.requests:.0f} tokens on average, "
        f"{args.requests} requests at {args.rate:g}/s (Poisson, seed {args.seed}), "
        f"max_tokens {args.max_tokens}"
    )
    text = header + "\n" + table(rows) + "\n"
    print("\n" + text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
