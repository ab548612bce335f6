"""Qwen3-MoE on one GPU: the fused MoE Triton kernel against the plain-torch path.

    python benchmarks/moe_bench.py                 # Qwen3-30B-A3B's shape, random bf16 weights
    python benchmarks/moe_bench.py --quick         # 4 layers and a small workload: a smoke test
    python benchmarks/moe_bench.py --out r.json    # also the results as JSON

The model has Qwen3-30B-A3B's shape (48 layers, hidden 2048, 128 experts of width 768, 8 per token
renormalised, 32 query and 4 KV heads of 128, vocabulary 151,936, untied: 30.5 billion parameters,
57 GiB in bf16) with random weights drawn on the GPU, so nothing is downloaded or written to disk
(the 57 GiB checkpoint would not fit the disk beside the model): only config.json is written, and
the engine's weight loading is replaced by random tensors of the shapes it expects. A random router
spreads tokens over the experts about evenly, which a trained one does not quite do.

What it prints:
* the MoE layer alone (one layer's router output, experts' weights): fused kernel vs the torch path
  (`moe_experts`) at 1 to 4096 tokens, GPU time by CUDA events;
* a decode step at batch 1 (the overlap loop): fused kernel with CUDA graphs; the torch path
  eager (it syncs the host, so no graphs); the torch path's capture-safe form in CUDA graphs;
* offline throughput of upstream's 256-request workload (input and output lengths uniform in
  [100, 1024], fixed seed, ignore_eos) with the fused kernel; and the fused kernel against the
  torch path on its first 8 prompts, 64 tokens each (the torch path is too slow for more in the
  time a run has).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overlap_ablation import TimedLLM, decode_step_times, release, run_workload, warm_up, workload  # noqa: E402, I001

from minisgl.kernel.moe import moe_experts, route  # noqa: E402
from minisgl.models import ModelConfig, create_model  # noqa: E402

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "dtype": "bfloat16",
}


@contextmanager
def random_weights():
    """The engine's load_model replaced: the model built from config.json with random weights
    drawn on the device (matrices N(0, 0.02), norms 1), no checkpoint read."""

    def load_model(model_dir, dtype, device, max_positions=None, comm=None):  # load_model's own
        cfg = ModelConfig.from_dir(model_dir)
        model = create_model(cfg, dtype, torch.device("meta"), max_positions)
        gen = torch.Generator(device=device).manual_seed(0)
        state = {}
        for key, t in model.named_tensors():
            if t.dim() == 1:
                state[key] = torch.ones(t.shape, dtype=dtype, device=device)
            else:
                w = torch.empty(t.shape, dtype=dtype, device=device)
                state[key] = w.normal_(0, 0.02, generator=gen)
        model.load_state_dict(state)
        model.move_rotary(device)
        return model

    with mock.patch("minisgl.engine.engine.load_model", load_model):
        yield


def layer_alone(cfg: dict, sizes) -> Dict[str, Dict[str, float]]:
    from minisgl.kernel.triton_moe import fused_moe

    h, e, k, inter = (
        cfg["hidden_size"],
        cfg["num_experts"],
        cfg["num_experts_per_tok"],
        cfg["moe_intermediate_size"],
    )
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(e, 2 * inter, h, device="cuda", generator=gen).bfloat16() * 0.02
    down = torch.randn(e, h, inter, device="cuda", generator=gen).bfloat16() * 0.02
    router = torch.randn(e, h, device="cuda", generator=gen).bfloat16() * 0.02
    out = {}
    for n in sizes:
        x = torch.randn(n, h, device="cuda", generator=gen).bfloat16()
        weights, ids = route(x @ router.t(), k, True)
        row = {}
        for name, fn in (("fused", fused_moe), ("torch", moe_experts)):
            for _ in range(3):
                fn(x, gate_up, down, weights, ids)  # warm-up: compiles, settles cuBLAS
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            reps = 20
            start.record()
            for _ in range(reps):
                fn(x, gate_up, down, weights, ids)
            end.record()
            torch.cuda.synchronize()
            row[name] = start.elapsed_time(end) / reps
        diff = fused_moe(x, gate_up, down, weights, ids) - moe_experts(
            x, gate_up, down, weights, ids
        )
        row["max_abs_diff"] = float(diff.abs().max())
        used = int((torch.bincount(ids.reshape(-1), minlength=e) > 0).sum())
        print(
            f"  {n:>5} tokens ({used:>3} experts used): fused {row['fused']:7.3f} ms, torch "
            f"{row['torch']:7.3f} ms ({row['torch'] / row['fused']:5.1f}x), max |diff| "
            f"{row['max_abs_diff']:.2e}"
        )
        out[str(n)] = row
    return out


def build(model_dir: Path, fused: bool, graphs: bool, max_running_req: int) -> TimedLLM:
    return TimedLLM(
        model_dir,
        dtype=torch.bfloat16,
        device="cuda",
        max_running_req=max_running_req,
        fused_kernels=fused,
        use_cuda_graph=graphs,
        cuda_graph_max_bs=max_running_req,
        cache_type="naive",  # the same prompts run more than once: no prefix-cache flattery
        max_seq_len_override=2048 + 64,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 layers, 64 short requests")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the model's 48")
    ap.add_argument("--max-running-req", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    cfg = dict(QWEN3_30B_A3B)
    if args.quick or args.layers:
        cfg["num_hidden_layers"] = args.layers or 4
    n, lo, hi = (64, 100, 256) if args.quick else (256, 100, 1024)
    results: dict = {"model": "Qwen3-30B-A3B shape, random bf16 weights", "config": cfg}
    print(f"GPU: {torch.cuda.get_device_name()}; layers {cfg['num_hidden_layers']}")

    print("the MoE layer alone (bf16, GPU time per call):")
    results["layer"] = layer_alone(cfg, (1, 8, 64, 512, 4096))

    model_dir = Path(tempfile.mkdtemp()) / "qwen3-30b-a3b-shape"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    vocab = cfg["vocab_size"]
    prompts, params = workload(n, lo, hi, vocab)
    # The torch path's comparison: its first `few` prompts, 64 tokens each. The torch path's decode
    # step is ~150 ms at batch 1 on the full shape (its experts one by one, a host sync each), so
    # the first 32 requests at their own lengths did not end in the 380 s a run had (2026-12-03).
    few = min(8, n)
    few_params = [dataclasses.replace(p, max_tokens=64) for p in params[:few]]

    runs = {}
    with random_weights():
        for name, fused, graphs in (
            ("fused kernel, CUDA graphs", True, True),
            ("torch path, eager", False, False),
            ("torch path, CUDA graphs (capture-safe form)", False, True),
        ):
            t0 = time.perf_counter()
            llm = build(model_dir, fused, graphs, args.max_running_req)
            built = time.perf_counter() - t0
            warm_up(llm, vocab, n=8)
            step = decode_step_times(llm, vocab, batch=1, prompt_len=256, steps=32)
            wall, gpu = step["wall_ms"], step["gpu_ms"]
            run = {"build_s": built, "decode_b1_wall_ms": wall, "decode_b1_gpu_ms": gpu}
            print(
                f"{name}: built in {built:.1f} s; decode step at batch 1: {wall:.2f} ms wall, "
                f"{gpu:.2f} ms GPU"
            )
            if not graphs or fused:  # the capture-safe form is for decode only: skip its workload
                r = run_workload(llm, prompts[:few], few_params)
                run[f"offline_{few}x64"] = r
                print(
                    f"  offline, first {few} prompts, 64 tokens each: {r['out_tok_s']:.0f} output "
                    f"tok/s ({r['wall_s']:.1f} s)"
                )
            if fused:
                r = run_workload(llm, prompts, params)
                run[f"offline_{n}"] = r
                print(
                    f"  offline, all {n} requests: {r['out_tok_s']:.0f} output tok/s, "
                    f"{r['total_tok_s']:.0f} total tok/s ({r['wall_s']:.1f} s), GPU busy "
                    f"{100 * r['gpu_busy']:.0f} %"
                )
            runs[name] = run
            release(llm)
            # release() cannot drop this frame's reference: without it the next build met the
            # 57 GiB of this one still held (out of memory on the H200, 2026-12-03)
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    results["runs"] = runs
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
