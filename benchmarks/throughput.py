"""Tokens per second of minisgl's `LLM.generate` against transformers' batched `generate`, on the
same model, prompts and machine, in one run: the overlap and the normal loop, 1 and 32 requests,
at the checkpoint's dtype and at float32, on an idle machine and beside a competing CPU-bound
process (`python -c 'while True: pass'`, started by this script).

    python benchmarks/throughput.py                  # the bundled model on the CPU
    python benchmarks/throughput.py --device cuda --model /path/to/Qwen3-0.6B --no-busy

Every request generates exactly --new-tokens tokens (ignore_eos), greedy. The figure is generated
tokens divided by the wall time of the whole call, prefill included; the best of --repeat calls.
transformers runs its own batched `generate` with left padding on the same prompts.

Each figure comes from a fresh process with default settings, as a user gets them: minisgl with
its thread policy (minisgl/utils/threads.py), transformers with torch's default threads (one per
core). `--hf-threads 1` adds transformers at one thread, to tell the threads from the rest. Run it
with OMP_NUM_THREADS unset, or every process gets that many threads.
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
SEEDS = [
    "ROMEO:\n",
    "JULIET:\n",
    "HAMLET:\nTo be, or not to be",
    "KING LEAR:\n",
    "MACBETH:\nIs this a dagger",
    "PORTIA:\nThe quality of mercy",
    "OTHELLO:\n",
    "PUCK:\n",
]


def make_prompts(tokenizer, n: int) -> list[list[int]]:
    return [tokenizer.encode(SEEDS[i % len(SEEDS)] * (1 + i % 3)).ids for i in range(n)]


def bench_minisgl(model, prompts, new_tokens, overlap, device, dtype, repeat) -> float:
    from minisgl import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(
        model,
        device=device,
        dtype=dtype,
        max_running_req=max(32, len(prompts)),
        overlap_scheduling=overlap,
    )
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    best = 0.0
    for _ in range(repeat):
        llm.engine.synchronize()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, progress=False)
        llm.engine.synchronize()
        elapsed = time.perf_counter() - start
        assert all(len(o["token_ids"]) == new_tokens for o in outs)
        best = max(best, len(prompts) * new_tokens / elapsed)
    return best


def bench_hf(model, prompts, new_tokens, device, dtype, repeat) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    kw = dict(do_sample=False, pad_token_id=pad)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = 0.0
    with torch.no_grad():
        hf.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=4, **kw)
        for _ in range(repeat):
            sync()
            start = time.perf_counter()
            out = hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                **kw,
            )
            sync()
            elapsed = time.perf_counter() - start
            assert out.shape[1] - width == new_tokens
            best = max(best, len(prompts) * new_tokens / elapsed)
    return best


def child(spec: dict) -> None:
    """One measurement, in this (fresh) process; prints its tokens per second as JSON."""
    import torch
    from tokenizers import Tokenizer

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    model = Path(spec["model"])
    prompts = make_prompts(Tokenizer.from_file(str(model / "tokenizer.json")), spec["n"])
    dtype = getattr(torch, spec["dtype"])
    args = (model, prompts, spec["new_tokens"])
    if spec["who"] == "hf":
        tps = bench_hf(*args, spec["device"], dtype, spec["repeat"])
    else:
        tps = bench_minisgl(*args, spec["who"] == "overlap", spec["device"], dtype, spec["repeat"])
    print(json.dumps({"tps": tps, "threads": torch.get_num_threads()}))


def measure(spec: dict) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO), MINISGL_PROGRESS="off")
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{spec}: {out.stderr[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["tps"], got["threads"]


def checkpoint_dtype(model: Path) -> str:
    config = json.loads((model / "config.json").read_text())
    return config.get("dtype") or config.get("torch_dtype") or "float32"  # transformers 5, 4


def main() -> None:
    from minisgl.models import BUNDLED_MODEL

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--dtypes", nargs="+", default=None, help="default: the checkpoint's, float32")
    ap.add_argument("--repeat", type=int, default=3, help="calls per process; the best counts")
    ap.add_argument("--no-busy", action="store_true", help="skip the competing process")
    ap.add_argument("--hf-threads", type=int, default=None, help="also transformers at N threads")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    dtypes = args.dtypes or list(dict.fromkeys([checkpoint_dtype(args.model), "float32"]))
    whos = ["overlap", "normal", "hf"] + (["hf1"] if args.hf_threads else [])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"model {args.model.name}, device {args.device}, {args.new_tokens} new tokens a request, "
        f"greedy, ignore_eos; {os.cpu_count()} CPUs, load average at start {load}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    head = f"{'hog':>4} {'dtype':>8} {'reqs':>4} {'overlap':>9} {'normal':>9} {'HF':>9}"
    head += f" {'HF@' + str(args.hf_threads) + 'thr':>9}" if args.hf_threads else ""
    print(head + f" {'overlap/HF':>10} {'normal/HF':>9}   (tok/s; threads: ours, HF)")
    print("(hog: beside `python -c 'while True: pass'`, started by this script)")
    for busy in [False] + ([] if args.no_busy else [True]):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for dtype in dtypes:
                for n in args.batches:
                    got, threads = {}, {}
                    for who in whos:
                        spec = dict(
                            who="hf" if who == "hf1" else who,
                            model=str(args.model),
                            n=n,
                            new_tokens=args.new_tokens,
                            device=args.device,
                            dtype=dtype,
                            repeat=args.repeat,
                            threads=args.hf_threads if who == "hf1" else None,
                        )
                        got[who], threads[who] = measure(spec)
                    cells = " ".join(f"{got[w]:>9.0f}" for w in whos)
                    print(
                        f"{'yes' if busy else 'no':>4} {dtype:>8} {n:>4} {cells} "
                        f"{got['overlap'] / got['hf']:>9.2f}x {got['normal'] / got['hf']:>8.2f}x"
                        f"   ({threads['overlap']}, {threads['hf']})",
                        flush=True,
                    )
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()


if __name__ == "__main__":
    main()
