"""One decode step on one GPU, against the memory floor: batch 1 and batch 64 on Qwen3-0.6B's shape
(dummy bf16 weights, CUDA graphs on), with programmatic dependent launch on and off, beside
transformers' static cache + torch.compile at batch 1.

    python benchmarks/decode_step.py               # PDL on and off, batch 1 and 64
    python benchmarks/decode_step.py --repeat 2    # each twice, alternating (PDL varies by run)
    python benchmarks/decode_step.py --hf-compile  # and transformers + torch.compile (minutes)

Each setting runs in a fresh process: MINISGL_PDL is read when the Triton kernels are first
imported. For each it prints the wall time of a step in the overlap loop, its GPU time (CUDA
events), kernels a step and how busy the GPU is (torch profiler, 10 steps), and the bytes a step
must read (every weight once, the batch's cached keys and values) over its GPU time, beside the
floor: those bytes at the H200's 4.3 TB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overlap_ablation import QWEN3_06B, build, decode_step_times, make_dummy_model, warm_up  # noqa: E402, I001

PEAK_TB_S = 4.3  # an H200's memory bandwidth, as its floor is stated (HOPPER.md: 4.8 on paper)
PROMPT, STEPS = 512, 128


def kv_bytes_per_token() -> int:
    c = QWEN3_06B
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * 2


def child(model_dir: Path) -> dict:
    """This process's setting (MINISGL_PDL from the environment), batch 1 and 64."""
    from minisgl.kernel import triton_pdl

    llm = build(model_dir, 64, True, 1024, 64 * 1024 + 4096)
    warm_up(llm, QWEN3_06B["vocab_size"])
    tensors = {t.data_ptr(): t for _, t in llm.engine.model.named_tensors()}  # tied: read once
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    out = {"pdl": bool(triton_pdl.PDL), "weight_bytes": weights}
    for bs in (1, 64):
        step = decode_step_times(llm, QWEN3_06B["vocab_size"], bs, PROMPT, STEPS, profile_steps=10)
        # the cache a step reads: each request's keys so far, on average half-way through the run
        kv = bs * (PROMPT + 4 + STEPS / 2) * kv_bytes_per_token()
        step["bytes"] = weights + kv
        out[f"bs{bs}"] = step
    llm.shutdown()
    return out


def hf_compiled_ms_per_token(model_dir: Path, new: int = 128) -> float:
    """transformers at batch 1 with a static cache and torch.compile (the usual low-latency set-up
    without a serving engine): ms per generated token, prefill excluded."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    ids = torch.randint(0, QWEN3_06B["vocab_size"], (1, PROMPT), device="cuda")

    def gen(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            cache_implementation="static",
            pad_token_id=0,
        )
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(3):  # compiles, then settles the graphs
        gen(new + 16)
        gen(16)
    return (gen(new + 16) - gen(16)) * 1000 / new


def report(name: str, r: dict) -> None:
    for bs in (1, 64):
        s = r[f"bs{bs}"]
        floor_ms = s["bytes"] / PEAK_TB_S / 1e9
        print(
            f"{name:15s} batch {bs:2d}: {s['wall_ms']:.3f} ms wall/step, {s['gpu_ms']:.3f} ms GPU, "
            f"{s['kernels']:.0f} kernels, GPU busy {100 * s['busy']:.1f}% (profiled); reads "
            f"{s['bytes'] / 1e9:.2f} GB = {s['bytes'] / s['gpu_ms'] / 1e9:.2f} TB/s; floor "
            f"{floor_ms:.3f} ms ({floor_ms / s['wall_ms']:.0%} of it)",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf-compile", action="store_true", help="also transformers + torch.compile")
    ap.add_argument(
        "--repeat", type=int, default=1, help="runs of each setting, alternating (PDL varies)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print("RESULT " + json.dumps(child(args.child), default=str), flush=True)
        return
    if not torch.cuda.is_available():
        sys.exit("benchmarks/decode_step.py measures a GPU: it needs a CUDA GPU and Triton")
    tmp = Path(tempfile.mkdtemp(prefix="qwen3-0.6b-dummy-"))
    make_dummy_model(tmp)
    torch.cuda.empty_cache()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["date"] = time.strftime("%Y-%m-%d")
    runs = {"1": [], "0": []}
    for i, pdl in enumerate(["1", "0"] * args.repeat):
        env = {**os.environ, "MINISGL_PDL": pdl}
        run = subprocess.run(
            [sys.executable, __file__, "--child", str(tmp)],
            env=env,
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
        if run.returncode or not lines:
            sys.exit(f"MINISGL_PDL={pdl}: the run failed\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
        r = json.loads(lines[-1][len("RESULT ") :])
        runs[pdl].append(r)
        report(f"run {i // 2 + 1}, PDL {'on' if r['pdl'] else 'off'}", r)
    res["runs"] = runs
    for bs in (1, 64):
        for on, off in zip(runs["1"], runs["0"]):
            ratio = off[f"bs{bs}"]["wall_ms"] / on[f"bs{bs}"]["wall_ms"]
            print(f"batch {bs:2d}: PDL makes a step {ratio:.2f}x as fast", flush=True)
    if args.hf_compile:
        res["hf_compile_ms"] = ms = hf_compiled_ms_per_token(tmp)
        for pdl, name in (("1", "on, the default"), ("0", "off")):
            b1 = min(r["bs1"]["wall_ms"] for r in runs[pdl])
            print(
                f"transformers, static cache + torch.compile, batch 1: {ms:.3f} ms/token "
                f"(the engine's step, PDL {name}, {ms / b1:.2f}x faster)"
            )
    if args.out is not None:
        args.out.write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
