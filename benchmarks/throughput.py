"""Tokens per second of minisgl's `LLM.generate` against transformers' `generate`, on the same
model, prompts and machine, in one run: overlap on and off, 1 and 32 requests.

    python benchmarks/throughput.py                 # the bundled model on the CPU
    python benchmarks/throughput.py --device cuda --model /path/to/Qwen3-0.6B

Every request generates exactly --new-tokens tokens (ignore_eos), greedy. The figure is generated
tokens divided by wall time of the whole call, prefill included. transformers runs its own batched
`generate` with left padding; it is given the same prompts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def make_prompts(tokenizer, n: int) -> list[list[int]]:
    seeds = [
        "ROMEO:\n",
        "JULIET:\n",
        "HAMLET:\nTo be, or not to be",
        "KING LEAR:\n",
        "MACBETH:\nIs this a dagger",
        "PORTIA:\nThe quality of mercy",
        "OTHELLO:\n",
        "PUCK:\n",
    ]
    return [tokenizer.encode(seeds[i % len(seeds)] * (1 + i % 3)).ids for i in range(n)]


def bench_minisgl(
    model: Path, prompts, new_tokens: int, overlap: bool, device: str, dtype
) -> float:
    from minisgl import SamplingParams
    from minisgl.env import ENV
    from minisgl.llm import LLM

    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    llm = LLM(model, device=device, dtype=dtype, max_running_req=max(32, len(prompts)))
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    llm.engine.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    llm.engine.synchronize()
    elapsed = time.perf_counter() - start
    assert all(len(o["token_ids"]) == new_tokens for o in outs)
    return len(prompts) * new_tokens / elapsed


def bench_hf(model: Path, prompts, new_tokens: int, device: str, dtype) -> float:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    kw = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad
    )
    with torch.no_grad():
        hf.generate(
            input_ids=ids[:1],
            attention_mask=mask[:1],
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=pad,
        )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = hf.generate(input_ids=ids, attention_mask=mask, **kw)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    assert out.shape[1] - width == new_tokens
    return len(prompts) * new_tokens / elapsed


def main() -> None:
    from minisgl.models import BUNDLED_MODEL

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    args = ap.parse_args()
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    print(
        f"model {args.model.name}, device {args.device}, dtype {dtype}, {args.new_tokens} new "
        "tokens per request, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"{'requests':>8} {'minisgl overlap':>16} {'minisgl normal':>15} {'transformers':>13} "
        f"{'best/HF':>8}"
    )
    for n in args.batches:
        prompts = make_prompts(tok, n)
        on = bench_minisgl(args.model, prompts, args.new_tokens, True, args.device, dtype)
        off = bench_minisgl(args.model, prompts, args.new_tokens, False, args.device, dtype)
        hf = bench_hf(args.model, prompts, args.new_tokens, args.device, dtype)
        print(f"{n:>8} {on:>12.0f} t/s {off:>11.0f} t/s {hf:>9.0f} t/s {max(on, off) / hf:>7.2f}x")


if __name__ == "__main__":
    main()
