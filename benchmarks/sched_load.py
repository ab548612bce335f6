"""Scheduling under load (chapter 23): what optimistic admission, the cache-aware order and each
engine feature buy, measured on the offline engine with requests arriving while it runs.

    python benchmarks/sched_load.py                      # the bundled model on the CPU, small
    python benchmarks/sched_load.py --gpu                # Qwen3-0.6B's shape, dummy bf16 weights

Parts (`--parts`, default all):
* itl: 16 streaming decoders while long prompts arrive (2k-4k tokens on the GPU, 256-512 on the
  CPU): inter-token latency p50/p99/max of the decoders, mixed prefill+decode batches against
  prefill-only steps, at two prefill chunk sizes.
* admission: a small fixed KV pool, requests that stop well before their max_tokens (a stop token
  taken from a first run's own output, so both runs stop at the same place): the most requests
  decoding at once, output tokens/s and retractions, reserve-all against optimistic admission.
* prefix: a multi-tenant workload (tenants with long system prompts, requests interleaved):
  prefill tokens computed, TTFT p50/p99 and tokens/s, FCFS against longest-prefix-match.
* ablation: everything on, then each of overlap scheduling, CUDA graphs, the radix cache, chunked
  prefill, mixed batches and optimistic admission off in turn, on upstream's workload (a burst of
  256 requests, input and output lengths uniform in [100, 1024]; 24 smaller ones on the CPU) and on
  a shared-prefix one (64 requests of 4 tenants arriving over 2 s; 16 on the CPU), each chosen by
  `--workloads`: tokens/s, TTFT and ITL p50/p99, prefill tokens, each feature's contribution
  (everything-on's throughput over the run without it) and how long each configuration took; a
  fixed KV pool (64k tokens on the GPU, 1.5k on the CPU, 4k for the CPU's tenants), so that
  admission matters. On the CPU each is the best of 3 runs (its runs last seconds on shared cores).

Times come from the engine's event log: a request's tokens arrive with its `send` events; TTFT runs
from the moment it was added, ITL between its consecutive tokens. Every figure is one run, printed
side by side with the run it is compared with; a benchmark, never a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minisgl.bench.stats import percentile  # noqa: E402
from minisgl.core import SamplingParams, set_global_ctx  # noqa: E402
from minisgl.llm import LLM  # noqa: E402


@dataclass
class Arrival:
    at: float  # seconds after the start
    prompt: List[int]
    params: SamplingParams
    tag: str = ""  # which group of requests it belongs to (e.g. "decoder", "long")


@dataclass
class Run:
    wall_s: float
    added: Dict[int, float]  # uid -> time added
    tokens: Dict[int, List[float]] = field(default_factory=dict)  # uid -> arrival of each token
    tags: Dict[int, str] = field(default_factory=dict)
    prefill_tokens: int = 0
    most_decoding: int = 0
    retractions: int = 0

    def out_tok_s(self) -> float:
        return sum(len(t) for t in self.tokens.values()) / self.wall_s

    def ttft(self, tag: str | None = None) -> List[float]:
        return [
            ts[0] - self.added[u]
            for u, ts in self.tokens.items()
            if ts and (tag is None or self.tags[u] == tag)
        ]

    def itl(self, tag: str | None = None) -> List[float]:
        return [
            b - a
            for u, ts in self.tokens.items()
            if tag is None or self.tags[u] == tag
            for a, b in zip(ts, ts[1:])
        ]


def drive(llm: LLM, arrivals: List[Arrival]) -> Run:
    """Add each request at its time, step the engine until everything has finished."""
    log = llm.events.record()
    pending = sorted(arrivals, key=lambda a: a.at)
    run = Run(wall_s=0.0, added={})
    start = time.perf_counter()
    while pending or llm.busy:
        now = time.perf_counter() - start
        while pending and pending[0].at <= now:
            a = pending.pop(0)
            uid = llm.add_request(a.prompt, a.params)
            run.added[uid], run.tags[uid] = time.perf_counter(), a.tag
        if llm.busy:
            llm.step()
        elif pending:
            time.sleep(max(0.0, pending[0].at - (time.perf_counter() - start)))
    run.wall_s = time.perf_counter() - start
    for e in log:
        if e.kind == "send":
            for m in e["msgs"]:
                if m.next_token >= 0:
                    run.tokens.setdefault(m.uid, []).append(e.time)
        elif e.kind == "launch":
            if e["phase"] == "prefill":
                run.prefill_tokens += sum(e["extend_lens"])
            else:
                run.most_decoding = max(run.most_decoding, len(e["uids"]))
        elif e.kind == "retract":
            run.retractions += 1
    llm.events.records = None
    return run


def ms(values: List[float], p: float) -> str:
    return f"{percentile(values, p) * 1000:8.1f}" if values else "       -"


# ---------------------------------------------------------------------------- the machine


@dataclass
class Setup:
    model: Path
    device: str
    dtype: torch.dtype
    vocab: int
    scale: int  # 1 on the CPU; the GPU's workloads are this much longer
    gpu: bool


def build(setup: Setup, **options) -> LLM:
    base = dict(device=setup.device, dtype=setup.dtype, max_running_req=64)
    if not setup.gpu:
        base.update(max_running_req=32, use_cuda_graph=False)
    base.update(options)
    return LLM(setup.model, **base)


def release(llm: LLM) -> None:
    llm.shutdown()
    set_global_ctx(None)
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rand_prompt(rng: random.Random, vocab: int, n: int) -> List[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


# ---------------------------------------------------------------------------- parts


def part_itl(setup: Setup) -> Dict:
    rng = random.Random(0)
    s = setup.scale
    decode_tokens = 48 * s
    arrivals = [
        Arrival(
            0.0,
            rand_prompt(rng, setup.vocab, 16),
            SamplingParams(max_tokens=decode_tokens, ignore_eos=True),
            "decoder",
        )
        for _ in range(16)
    ]
    # the long prompts arrive once the decoders are decoding, a few steps apart
    for k in range(4):
        n = rng.randint(256, 512) * s
        arrivals.append(
            Arrival(
                0.3 * (k + 1),
                rand_prompt(rng, setup.vocab, n),
                SamplingParams(max_tokens=4, ignore_eos=True),
                "long",
            )
        )
    out = {}
    print("\n== itl: 16 streaming decoders while long prompts arrive (ms)")
    print(
        f"{'prefill chunk':>14} {'batches':>8} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8} "
        f"{'long TTFT p50':>14}"
    )
    for chunk in (512 * s, 128 * s):
        for mixed in (False, True):
            llm = build(setup, max_extend_tokens=chunk, mixed_batches=mixed)
            llm.generate(
                [rand_prompt(rng, setup.vocab, 8)], SamplingParams(max_tokens=2), progress=False
            )
            run = drive(llm, arrivals)
            release(llm)
            itl, long_ttft = run.itl("decoder"), run.ttft("long")
            name = "mixed" if mixed else "unmixed"
            out[f"chunk{chunk}-{name}"] = dict(
                itl_p50=percentile(itl, 50),
                itl_p99=percentile(itl, 99),
                itl_max=max(itl),
                long_ttft_p50=percentile(long_ttft, 50),
            )
            print(
                f"{chunk:>14} {name:>8} {ms(itl, 50)} {ms(itl, 99)} {max(itl) * 1000:8.1f} "
                f"{ms(long_ttft, 50):>14}"
            )
        u, m = out[f"chunk{chunk}-unmixed"], out[f"chunk{chunk}-mixed"]
        print(
            f"   chunk {chunk}, mixed / unmixed: ITL p99 {m['itl_p99'] / u['itl_p99']:.2f}x, "
            f"max {m['itl_max'] / u['itl_max']:.2f}x, long prompts' TTFT p50 "
            f"{m['long_ttft_p50'] / u['long_ttft_p50']:.2f}x"
        )
    return out


def stopping_workload(setup: Setup, n: int, seed: int = 0):
    """n requests with max_tokens 128*s that stop at a token of their own greedy output, at 10-60%
    of max_tokens: the stop token is read from a first, unpressured run."""
    rng = random.Random(seed)
    s = setup.scale
    prompts = [rand_prompt(rng, setup.vocab, rng.randint(16, 48) * s) for _ in range(n)]
    max_tokens = 128 * s
    llm = build(setup, max_running_req=64)
    outs = llm.generate(
        prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True), progress=False
    )
    release(llm)
    params = []
    for o in outs:
        ids = o["token_ids"]
        stop = ids[rng.randint(max_tokens // 10, max_tokens * 6 // 10)]
        params.append(SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=[stop]))
    return prompts, params


def part_admission(setup: Setup) -> Dict:
    n = 48
    prompts, params = stopping_workload(setup, n)
    s = setup.scale
    pages = 1200 * s  # about 8 requests' whole lives; many more of their real needs
    arrivals = [Arrival(0.0, p, q) for p, q in zip(prompts, params)]
    out = {}
    print(f"\n== admission: {n} requests that stop early, a KV pool of {pages} tokens")
    print(
        f"{'admission':>12} {'most decoding':>14} {'out tok/s':>10} {'wall s':>8} "
        f"{'retractions':>12}"
    )
    tokens = {}
    for name, optimistic in (("reserve-all", False), ("optimistic", True)):
        llm = build(
            setup, num_page_override=pages, optimistic_admission=optimistic, cache_type="radix"
        )
        run = drive(llm, arrivals)
        release(llm)
        tokens[name] = sorted(len(t) for t in run.tokens.values())
        out[name] = dict(
            most_decoding=run.most_decoding,
            out_tok_s=run.out_tok_s(),
            wall_s=run.wall_s,
            retractions=run.retractions,
        )
        print(
            f"{name:>12} {run.most_decoding:>14} {run.out_tok_s():>10.1f} {run.wall_s:>8.2f} "
            f"{run.retractions:>12}"
        )
    r, o = out["reserve-all"], out["optimistic"]
    print(
        f"   optimistic / reserve-all: {o['most_decoding'] / r['most_decoding']:.2f}x running, "
        f"{o['out_tok_s'] / r['out_tok_s']:.2f}x throughput; same tokens per request: "
        f"{tokens['reserve-all'] == tokens['optimistic']}"
    )
    return out


def tenant_workload(setup: Setup, n: int, seed: int = 0, spread_s: float = 0.0):
    """n requests from 4 tenants, each tenant's system prompt 384*s tokens, a question of 16-64*s
    tokens each, tenants interleaved; arrivals spread evenly over `spread_s` seconds."""
    rng = random.Random(seed)
    s = setup.scale
    systems = [rand_prompt(rng, setup.vocab, 384 * s) for _ in range(4)]
    arrivals = []
    for i in range(n):
        prompt = systems[i % 4] + rand_prompt(rng, setup.vocab, rng.randint(16, 64) * s)
        at = spread_s * i / n
        arrivals.append(Arrival(at, prompt, SamplingParams(max_tokens=16 * s, ignore_eos=True)))
    return arrivals


def part_prefix(setup: Setup) -> Dict:
    s = setup.scale
    arrivals = tenant_workload(setup, 32)
    pages = 1400 * s  # two tenants' system prompts and their running requests, not four
    out = {}
    print(
        f"\n== prefix: 32 requests of 4 tenants (system prompts {384 * s} tokens), "
        f"KV pool {pages} tokens, 8 running at most"
    )
    print(f"{'policy':>8} {'prefill tok':>12} {'TTFT p50':>9} {'TTFT p99':>9} {'out tok/s':>10}")
    for policy in ("fcfs", "lpm"):
        llm = build(setup, num_page_override=pages, max_running_req=8, schedule_policy=policy)
        run = drive(llm, arrivals)
        release(llm)
        ttft = run.ttft()
        out[policy] = dict(
            prefill_tokens=run.prefill_tokens,
            ttft_p50=percentile(ttft, 50),
            ttft_p99=percentile(ttft, 99),
            out_tok_s=run.out_tok_s(),
        )
        print(
            f"{policy:>8} {run.prefill_tokens:>12} {ms(ttft, 50):>9} {ms(ttft, 99):>9} "
            f"{run.out_tok_s():>10.1f}"
        )
    f, lp = out["fcfs"], out["lpm"]
    print(
        f"   lpm / fcfs: {lp['prefill_tokens'] / f['prefill_tokens']:.2f}x prefill tokens, "
        f"{lp['ttft_p50'] / f['ttft_p50']:.2f}x TTFT p50"
    )
    return out


def upstream_workload(setup: Setup, n: int, lo: int, hi: int, seed: int = 0):
    rng = random.Random(seed)
    return [
        Arrival(
            0.0,
            rand_prompt(rng, setup.vocab, rng.randint(lo, hi)),
            SamplingParams(max_tokens=rng.randint(lo, hi), ignore_eos=True),
        )
        for _ in range(n)
    ]


# The ablation's two workloads. On the GPU, upstream's burst (256 requests, input and output lengths
# uniform in [100, 1024]: about 144k output tokens) is what takes the time: its 7 configurations
# run for about 3.5 minutes on an H100, CUDA graphs off alone for over a minute. The tenants'
# workload ran after it under the same time limit and never got past "everything on". Each now has
# its own call (`--workloads`, gpu_check.sh gives each its own limit), and the tenants' is sized to
# finish all 7 configurations in about a minute and a half (see tenants_ablation_workload).
ABLATION_WORKLOADS = ("upstream", "tenants")


def tenants_ablation_workload(setup: Setup) -> List[Arrival]:
    """What the shared-prefix ablation measures: requests that share long system prompts and arrive
    over time, so that the radix cache, the order and admission have something to act on (upstream's
    burst shares nothing and arrives at once). 4 tenants' 3,072-token prompts (384 on the CPU), 64
    requests (16) with 128 output tokens (16) arriving over 2 s (1 s): about 8k output tokens and,
    without the cache, 220k prefill tokens on the GPU, most of which the cache saves."""
    if setup.gpu:
        return tenant_workload(setup, 64, spread_s=2.0)
    return tenant_workload(setup, 16, spread_s=1.0)


def ablation_workload(setup: Setup, name: str) -> List[Arrival]:
    if name == "upstream":
        return (
            upstream_workload(setup, 256, 100, 1024)
            if setup.gpu
            else upstream_workload(setup, 24, 16, 96)
        )
    if name == "tenants":
        return tenants_ablation_workload(setup)
    raise ValueError(f"unknown ablation workload {name!r}: expected one of {ABLATION_WORKLOADS}")


def ablation_configs(setup: Setup, wname: str):
    """(everything on, {configuration: what it turns off}) for this machine and workload."""
    if setup.gpu:
        everything = dict(
            overlap_scheduling=True,
            use_cuda_graph=True,
            cache_type="radix",
            max_extend_tokens=2048,
            optimistic_admission=True,
            mixed_batches=True,
            num_page_override=65536,  # a fixed pool, so that admission matters
        )
        chunk_off = 40960
    else:
        everything = dict(
            overlap_scheduling=True,
            use_cuda_graph=False,
            cache_type="radix",
            max_extend_tokens=256,
            optimistic_admission=True,
            mixed_batches=True,
            num_page_override=1536,  # a fixed pool, so that admission matters
        )
        if wname == "tenants":
            # the 4 tenants' prompts (1,536 tokens) and the running requests' questions: a pool of
            # 1,536 would evict every prompt before its tenant's next request, cache on or off
            everything["num_page_override"] = 4096
        chunk_off = 1024
    variants = {
        "everything on": {},
        "overlap off": dict(overlap_scheduling=False),
        "CUDA graphs off": dict(use_cuda_graph=False),
        "radix cache off": dict(cache_type="naive"),
        "chunked prefill off": dict(max_extend_tokens=chunk_off),
        "mixed batches off": dict(mixed_batches=False),
        "optimistic off": dict(optimistic_admission=False),
    }
    if not setup.gpu:
        del variants["CUDA graphs off"]  # no graphs on the CPU: the same run as everything on
    return everything, variants


def ablate(setup: Setup, wname: str, arrivals: List[Arrival]) -> Dict:
    """Every configuration of the ablation on one workload: the figures of each, and each feature's
    contribution (everything-on's throughput over the run without it)."""
    repeat = 1 if setup.gpu else 3
    everything, variants = ablation_configs(setup, wname)
    print(f"\n== ablation on {wname}-{len(arrivals)} ({'GPU' if setup.gpu else 'CPU'})")
    print(
        f"{'':>20} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} "
        f"{'ITL p99':>8} {'prefill tok':>11} {'retracted':>9} {'contribution':>12} {'took s':>7}"
    )
    out, base = {}, None
    for vname, change in variants.items():
        began = time.perf_counter()
        runs = []
        for _ in range(repeat):  # the best of `repeat` runs: a shared CPU is noisy
            llm = build(setup, **{**everything, **change})
            llm.generate(
                [rand_prompt(random.Random(1), setup.vocab, 32)] * 2,
                SamplingParams(max_tokens=4, ignore_eos=True),
                progress=False,
            )
            runs.append(drive(llm, arrivals))
            release(llm)
        run = max(runs, key=Run.out_tok_s)
        ttft, itl = run.ttft(), run.itl()
        tput = run.out_tok_s()
        base = base or tput
        took = time.perf_counter() - began  # building the engine (graphs captured) included
        out[vname] = dict(
            out_tok_s=tput,
            ttft_p50=percentile(ttft, 50),
            ttft_p99=percentile(ttft, 99),
            itl_p50=percentile(itl, 50),
            itl_p99=percentile(itl, 99),
            prefill_tokens=run.prefill_tokens,
            retractions=run.retractions,
            took_s=took,
        )
        contrib = "" if vname == "everything on" else f"{base / tput:11.2f}x"
        print(
            f"{vname:>20} {tput:>10.1f} {ms(ttft, 50):>9} {ms(ttft, 99):>9} {ms(itl, 50)} "
            f"{ms(itl, 99)} {run.prefill_tokens:>11} {run.retractions:>9} {contrib:>12} "
            f"{took:>7.1f}"
        )
    return out


def part_ablation(setup: Setup, workloads=ABLATION_WORKLOADS) -> Dict:
    return {name: ablate(setup, name, ablation_workload(setup, name)) for name in workloads}


PARTS = {
    "itl": part_itl,
    "admission": part_admission,
    "prefix": part_prefix,
    "ablation": part_ablation,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="Qwen3-0.6B's shape, dummy weights, cuda")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument(
        "--workloads",
        default=",".join(ABLATION_WORKLOADS),
        help="the ablation's workloads, comma-separated (upstream, tenants)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    workloads = args.workloads.split(",")
    for w in workloads:
        if w not in ABLATION_WORKLOADS:
            ap.error(f"unknown workload {w!r}: expected some of {', '.join(ABLATION_WORKLOADS)}")
    for name in args.parts.split(","):
        if name not in PARTS:
            ap.error(f"unknown part {name!r}: expected some of {', '.join(PARTS)}")
    if args.gpu:
        from overlap_ablation import QWEN3_06B, make_dummy_model

        tmp = tempfile.TemporaryDirectory()
        model = Path(tmp.name) / "qwen3-0.6b-dummy"
        del_model = make_dummy_model(model)
        del del_model
        torch.cuda.empty_cache()
        setup = Setup(model, "cuda", torch.bfloat16, QWEN3_06B["vocab_size"], 8, True)
    else:
        from minisgl.models import BUNDLED_MODEL

        vocab = json.loads((Path(BUNDLED_MODEL) / "config.json").read_text())["vocab_size"]
        setup = Setup(Path(BUNDLED_MODEL), "cpu", torch.float32, vocab, 1, False)
    print(
        f"sched_load on {setup.device} "
        f"({'Qwen3-0.6B shape, dummy bf16' if setup.gpu else 'bundled model, float32'}), "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    figures = {}
    for name in args.parts.split(","):
        part = PARTS[name]
        figures[name] = part(setup, workloads) if part is part_ablation else part(setup)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
