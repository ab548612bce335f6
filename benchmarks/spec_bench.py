"""Speculative decoding, measured (issue 47). Prints figures and ratios side by side; no test
times anything.

    python benchmarks/spec_bench.py                     # CPU, bundled model: acceptance, tokens/s
    python benchmarks/spec_bench.py --gpu               # Qwen3-0.6B's shape, dummy bf16 weights:
                                                        #   verify step vs decode step, k x batch
    python benchmarks/spec_bench.py --draft-model DIR   # the same CPU figures with a draft model

Acceptance (CPU, bundled model, greedy): for k = 1..8 and two workloads, a Shakespeare one (the
test prompts, continued) and a repetitive one (a passage given three times, which the model goes
on repeating), the mean accepted draft length per verify and the tokens each request gets per
target forward (verify or plain decode steps it rode in; 1.0 is plain decoding).

Speed (CPU): batch-1 tokens/s of one long greedy request with and without speculation, on both
workloads; the outputs are checked equal.

GPU: one verify step of k+1 tokens per request against one plain decode step (both replay a CUDA
graph: a verify step runs as decode rows, one per token, minisgl/engine/decode_rows.py), at batch
sizes 1..64: their ratio is the number of tokens a verify must
yield per request to pay. Speculation pays where the drafts' acceptance beats that ratio: at
small batch a step is bound by reading the weights, which k+1 tokens share, so the ratio stays
near 1; at large batch the step is bound by compute and the ratio grows towards k+1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch  # noqa: E402

from minisgl import LLM, SamplingParams  # noqa: E402
from minisgl.models import BUNDLED_MODEL  # noqa: E402

PROMPTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "KING HENRY:\nOnce more unto the breach, dear friends,",
    "To be, or not to be",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
]
PASSAGE = "KING HENRY:\nOnce more unto the breach, dear friends, once more;\n"


def workloads(llm) -> dict:
    shakespeare = [llm.encode(p).tolist() for p in PROMPTS]
    repetitive = [llm.encode(PASSAGE * 3).tolist()]
    return {"shakespeare": shakespeare, "repetitive": repetitive}


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


DEVICE = ["cpu"]  # --device
DTYPE: dict = {}  # --dtype: {} keeps the engine's default for the device


def build(**options) -> LLM:
    return LLM(BUNDLED_MODEL, device=DEVICE[0], **DTYPE, **options)


def acceptance(spec: dict, new_tokens: int) -> None:
    probe = build()
    loads = workloads(probe)
    print(f"\n== acceptance (greedy, {new_tokens} new tokens per request, k = 1..8)")
    print(f"{'workload':12} {'k':>2} {'accepted/verify':>16} {'tokens/forward':>15} {'same':>5}")
    for name, prompts in loads.items():
        want = [o["token_ids"] for o in probe.generate(prompts, greedy(new_tokens))]
        for k in range(1, 9):
            llm = build(num_speculative_tokens=k, **spec)
            log = llm.events.record()
            got = [o["token_ids"] for o in llm.generate(prompts, greedy(new_tokens))]
            s = llm.spec_stats
            # every request-row of a decode or verify step is one target forward for it
            rows = sum(
                len(e["uids"]) for e in log if e.kind == "launch" and e["phase"] != "prefill"
            )
            generated = sum(len(t) for t in got) - len(got)  # the prefill's token aside
            per_verify = s.accepted / s.requests if s.requests else 0.0
            print(
                f"{name:12} {k:2d} {per_verify:16.2f} {generated / max(rows, 1):15.2f} "
                f"{str(got == want):>5}"
            )


def tokens_per_second(spec: dict, new_tokens: int, repeat: int, k: int = 4) -> None:
    """Batch 1: plain decoding with the overlap loop and with the normal loop, and speculation
    (k drafts, 4 by default), which runs the normal loop: what speculation gains against what
    giving up overlap costs. A batch-1 step of the bundled model is the host's speed, which
    drifts from second to second on a shared machine, so the setups take turns: each round runs
    every setup once, and the ratio is taken within a round (its median and range printed)."""
    setups = {
        "overlap": dict(overlap_scheduling=True),
        "normal": dict(overlap_scheduling=False),
        f"spec k={k}": dict(num_speculative_tokens=k, **spec),
    }
    # the three engines live at once: on a GPU each takes a fifth of what is free when it is built
    # (the default share, 0.85, left the third engine out of memory)
    engines = {name: build(memory_ratio=0.2, **options) for name, options in setups.items()}
    loads = workloads(engines["overlap"])
    dtype = DTYPE.get("dtype", "the engine's default dtype")
    print(
        f"\n== batch-1 tokens/s on {DEVICE[0]}, {dtype} ({new_tokens} new tokens; median of "
        f"{repeat} rounds, the setups taking turns in each)"
    )
    print(
        f"{'workload':12} "
        + " ".join(f"{n:>9}" for n in setups)
        + "  spec/overlap (range over rounds)  same"
    )
    for name, prompts in loads.items():
        prompt = prompts[0]
        for llm in engines.values():
            llm.generate([prompt], greedy(8))  # warm up
        rates: dict = {n: [] for n in setups}
        outs = {}
        for _ in range(repeat):
            for setup, llm in engines.items():
                start = time.perf_counter()
                outs[setup] = llm.generate([prompt], greedy(new_tokens))[0]["token_ids"]
                rates[setup].append(new_tokens / (time.perf_counter() - start))
        spec_name = list(setups)[2]
        ratios = [s / o for s, o in zip(rates[spec_name], rates["overlap"])]
        same = all(o == outs["overlap"] for o in outs.values())
        print(
            f"{name:12} "
            + " ".join(f"{statistics.median(rates[n]):9.1f}" for n in setups)
            + f"  {statistics.median(ratios):12.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            + f"{'':>5}{same}"
        )
    for llm in engines.values():
        llm.shutdown()


class FixedDrafter:
    """Always k tokens (the request's last token repeated): a verify step of k+1 positions per
    request, whatever is accepted (its cost does not depend on acceptance)."""

    def propose(self, reqs, k):
        return [[int(r.input_ids[-1])] * k for r in reqs]

    def release(self, req):
        pass


def step_times(llm: LLM, batch: int, k: int | None, steps: int) -> float:
    """Mean seconds of one scheduler step of `batch` decoding requests (a verify step of k+1
    tokens each when k is set, else a plain decode step), after the prefill and a warm-up. One
    engine serves every figure: the drafter is switched (None: plain decoding)."""
    llm.drafter, llm.spec_k = (FixedDrafter(), k) if k else (None, 1)
    prompts = [[(7 * i + j) % 1000 + 10 for j in range(32)] for i in range(batch)]
    budget = (steps + 8) * ((k or 0) + 1)
    uids = [llm.add_request(p, greedy(budget)) for p in prompts]
    while llm.prefill_manager.runnable or len(llm.decode_manager.running) < batch:
        llm.step()
    for _ in range(3):
        llm.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        llm.step()
    torch.cuda.synchronize()
    took = (time.perf_counter() - start) / steps
    for uid in uids:
        llm.abort(uid)
    llm.run_until_idle()
    return took


def gpu(steps: int, batches: list, ks: list) -> None:
    from overlap_ablation import make_dummy_model

    with tempfile.TemporaryDirectory(prefix="qwen3-0.6b-dummy-") as tmp:
        model = Path(tmp) / "qwen3-0.6b-dummy"
        make_dummy_model(model)
        torch.cuda.empty_cache()
        llm = LLM(
            model,
            device="cuda",
            max_running_req=max(batches),
            cuda_graph_max_bs=max(batches),
            speculative="lookup",
            num_speculative_tokens=max(ks),  # graphs of up to max(batches) * (max(ks) + 1) rows
            overlap_scheduling=False,
        )
        print(f"\n== GPU {torch.cuda.get_device_name()}: Qwen3-0.6B's shape, dummy bf16 weights")
        print(
            "one step's time in ms, the normal loop (a plain decode step and a verify step each "
            "replay a CUDA graph);\nratio = verify / decode: the tokens per request a verify "
            "must give to pay"
        )
        head = " ".join(f"{'k=' + str(k):>15}" for k in ks)
        print(f"{'batch':>5} {'decode':>8} {head}")
        for b in batches:
            plain = step_times(llm, b, None, steps)
            cells = []
            for k in ks:
                v = step_times(llm, b, k, steps)
                cells.append(f"{v * 1e3:7.2f} ({v / plain:4.2f}x)")
            print(f"{b:5d} {plain * 1e3:8.2f} " + " ".join(f"{c:>15}" for c in cells), flush=True)
        llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="verify vs decode step on cuda")
    ap.add_argument("--draft-model", type=Path, default=None, help="speculate with this draft")
    ap.add_argument("--device", default="cpu", help="the bundled model's figures: cpu or cuda")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--speed-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="GPU: timed steps per figure")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    ap.add_argument("--speed-only", action="store_true", help="the tokens/s table alone")
    ap.add_argument("--speed-k", type=int, default=4, help="draft tokens in the tokens/s table")
    args = ap.parse_args()
    DEVICE[0] = args.device
    if args.dtype:
        DTYPE["dtype"] = getattr(torch, args.dtype)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"spec_bench {now}, torch {torch.__version__}")
    if args.gpu:
        gpu(
            args.steps,
            [int(b) for b in args.batches.split(",")],
            [int(k) for k in args.ks.split(",")],
        )
        return
    if args.draft_model is not None:
        spec = dict(speculative="draft", draft_model=str(args.draft_model))
        print(f"drafter: the draft model {args.draft_model}")
    else:
        spec = dict(speculative="lookup")
        print("drafter: prompt lookup (max_ngram 3, min_ngram 1)")
    print(f"threads: {torch.get_num_threads()}")
    if not args.speed_only:
        acceptance(spec, args.new_tokens)
    tokens_per_second(spec, args.speed_tokens, args.repeat, args.speed_k)


if __name__ == "__main__":
    main()
