"""The server under load: throughput, time to first token (TTFT) and inter-token latency (ITL) at
several request rates, against the offline `LLM.generate` on the same requests.

    python benchmarks/bench_serve.py --quick                    # bundled model, CPU, a smoke run
    python benchmarks/bench_serve.py                            # bundled model, CPU
    python benchmarks/bench_serve.py --dummy-qwen3-0.6b --device cuda --dtype bfloat16 \\
        --max-running-req 64 --num-requests 256 --rates 4,16,64,inf
    python benchmarks/bench_serve.py --model /path/to/Qwen3-0.6B --device cuda

Requests are random token ids (no tokenizer needed) with input and output lengths uniform in
[--min-len, --max-len] (fixed seed), greedy, ignore_eos, so the offline run and every rate do the
same work. At rate r, requests arrive as a Poisson process of r per second (inf: all at once); each
is a streamed /v1/completions call (httpx, in this process) with `return_token_ids`, so every token
is timed as it arrives. The figures come from minisgl/bench/stats.py (chapter 21): TTFT,
request sent to the first chunk with a token; ITL, between one such chunk and the next of the
same request (a chunk of several tokens counts once); throughput, output tokens over the span
from first request sent to last token; p50 and p99 by linear interpolation, as numpy's default.
The offline figure is output tokens over the wall time of one `generate` of all requests.
--dummy-qwen3-0.6b writes random bf16 weights of Qwen3-0.6B's shape (benchmarks/overlap_ablation.py;
needs a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from minisgl.bench.stats import output_throughput, percentile, stream_latencies  # noqa: E402


def workload(n: int, lo: int, hi: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    outputs = [rng.randint(lo, hi) for _ in range(n)]
    return prompts, outputs


def offline(model: Path, prompts, outputs, engine: Dict) -> float:
    """Output tokens per second of one LLM.generate call (after a warm-up)."""
    import torch

    from minisgl import SamplingParams
    from minisgl.core import set_global_ctx
    from minisgl.llm import LLM

    llm = LLM(model, **engine)
    llm.generate([prompts[0][:8]], SamplingParams(max_tokens=4, ignore_eos=True))
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in outputs]
    llm.engine.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    llm.engine.synchronize()
    elapsed = time.perf_counter() - start
    assert [len(o["token_ids"]) for o in outs] == outputs, "offline: a request stopped early"
    llm.shutdown()
    set_global_ctx(None)
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the server's own process needs the memory next
    return sum(outputs) / elapsed


async def one_request(
    client, url: str, model: str, prompt: List[int], max_tokens: int, delay: float
) -> Dict:
    await asyncio.sleep(delay)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    sent = time.perf_counter()
    chunks: List[Tuple[float, int]] = []  # (arrival, tokens in the chunk)
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the server answered {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"the server failed mid-stream: {chunk['error']['message']}")
            chunks.append((time.perf_counter(), len(chunk["choices"][0].get("token_ids", []))))
    got = sum(n for _, n in chunks)
    if got != max_tokens:
        raise RuntimeError(f"expected {max_tokens} tokens, got {got}")
    return {"sent": sent, "chunks": chunks}


async def run_rate(url: str, model: str, prompts, outputs, rate: float, seed: int = 1) -> Dict:
    import httpx

    rng = random.Random(seed)
    delays, t = [], 0.0
    for _ in prompts:
        delays.append(t)
        if math.isfinite(rate):
            t += rng.expovariate(rate)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        results = await asyncio.gather(
            *[one_request(client, url, model, p, m, d) for p, m, d in zip(prompts, outputs, delays)]
        )
    latencies = [stream_latencies(r["sent"], r["chunks"]) for r in results]
    ttft = [first for first, _ in latencies]
    itl = [gap for _, gaps in latencies for gap in gaps]
    spans = [(r["sent"], r["chunks"][-1][0], m) for r, m in zip(results, outputs)]
    return {
        "rate": rate,
        "throughput": output_throughput(spans),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": percentile(itl, 50) if itl else math.nan,
        "itl_p99": percentile(itl, 99) if itl else math.nan,
    }


def main() -> None:
    from minisgl.models import BUNDLED_MODEL, ModelConfig
    from minisgl.server.background import BackgroundServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    ap.add_argument(
        "--dummy-qwen3-0.6b",
        dest="dummy",
        action="store_true",
        help="random weights of Qwen3-0.6B's shape (GPU)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--max-running-req", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument(
        "--rates", default="2,8,inf", help="requests per second, comma-separated; inf: all at once"
    )
    ap.add_argument(
        "--quick", action="store_true", help="16 requests of 8-24 tokens at 4/s and all at once"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    if args.quick:
        args.num_requests, args.min_len, args.max_len, args.rates = 16, 8, 24, "4,inf"
    rates = [float(r) for r in args.rates.split(",")]

    tmp = tempfile.TemporaryDirectory()
    model = args.model
    if args.dummy:
        from overlap_ablation import make_dummy_model

        model = Path(tmp.name) / "qwen3-0.6b-dummy"
        make_dummy_model(model)  # returns the model in transformers, dropped at once
        args.dtype = args.dtype or "bfloat16"
    vocab = ModelConfig.from_dir(model).vocab_size
    prompts, outputs = workload(args.num_requests, args.min_len, args.max_len, vocab)
    engine = {"device": args.device, "max_running_req": args.max_running_req}
    if args.dtype:
        engine["dtype"] = args.dtype
    print(
        f"{model.name} on {args.device}: {len(prompts)} requests, input and output lengths in "
        f"[{args.min_len}, {args.max_len}] ({sum(outputs)} output tokens), max_running_req "
        f"{args.max_running_req}"
    )

    figures = {"offline_tok_s": offline(model, prompts, outputs, engine), "server": []}
    print(f"offline LLM.generate: {figures['offline_tok_s']:.0f} output tok/s")

    server_args = [
        "--model",
        str(model),
        "--device",
        args.device,
        "--max-running-req",
        str(args.max_running_req),
    ]
    if args.dtype:
        server_args += ["--dtype", args.dtype]
    with BackgroundServer(*server_args) as url:
        name = model.name
        asyncio.run(run_rate(url, name, prompts[:2], [4, 4], math.inf))  # warm-up
        print(
            f"{'rate (req/s)':>12} {'tok/s':>8} {'vs offline':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'ITL p50':>8} {'ITL p99':>8}   (ms)"
        )
        for rate in rates:
            f = asyncio.run(run_rate(url, name, prompts, outputs, rate))
            figures["server"].append(f)
            print(
                f"{rate:>12g} {f['throughput']:>8.0f} "
                f"{f['throughput'] / figures['offline_tok_s']:>9.0%} "
                f"{f['ttft_p50'] * 1e3:>9.1f} {f['ttft_p99'] * 1e3:>9.1f} "
                f"{f['itl_p50'] * 1e3:>8.1f} "
                f"{f['itl_p99'] * 1e3:>8.1f}"
            )
    if args.out:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **figures}, indent=1)
        )


if __name__ == "__main__":
    main()
