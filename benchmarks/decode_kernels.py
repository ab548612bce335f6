"""The decode step's kernels alone, on one GPU, at Qwen3-0.6B's shapes (bf16), timed inside CUDA
graphs as the engine runs them:

    python benchmarks/decode_kernels.py [--quick]

* paged decode attention (minisgl/kernel/triton_decode.py) with the code's launch settings and
  the best of a grid of others (keys per block, warps, pipeline stages, splits) for batches 1, 64
  and 256: microseconds and the bandwidth of the KV it reads;
* the matrix-vector products of a decode step at batch 1 and 2: torch's F.linear (cuBLAS) against
  the Triton kernel in minisgl/kernel/triton_ops.py, in microseconds and TB/s of weights read,
  and the best settings of that kernel at batch 1.

It prints what the settings in the code should be; it changes nothing.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __name__ == "__main__" and not torch.cuda.is_available():
    sys.exit("benchmarks/decode_kernels.py measures GPU kernels: it needs a CUDA GPU (and Triton)")

import triton  # noqa: E402
import triton.testing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minisgl.kernel import triton_ops  # noqa: E402
from minisgl.kernel.triton_decode import num_splits, paged_decode_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER, VOCAB = 16, 8, 128, 1024, 3072, 151936
LINEARS = {  # name: (out_features, in_features) of one decode step's products
    "qkv_proj": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
    "o_proj": (HIDDEN, HEADS * HEAD_DIM),
    "gate_up_proj": (2 * INTER, HIDDEN),
    "down_proj": (HIDDEN, INTER),
    "lm_head": (VOCAB, HIDDEN),
}
PER_STEP = {"qkv_proj": 28, "o_proj": 28, "gate_up_proj": 28, "down_proj": 28, "lm_head": 1}


def bench_us(fn) -> float:
    """Median microseconds of fn() replayed in a CUDA graph (no launch overhead, like the
    engine)."""
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=40) * 1000


def attention(quick: bool) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    for batch, ctx_len in [(1, 512), (1, 2048), (64, 768), (256, 840)]:
        locations = batch * ctx_len + 64
        k_cache = torch.randn(locations, KV_HEADS, HEAD_DIM, generator=g, device="cuda").bfloat16()
        v_cache = torch.randn_like(k_cache)
        q = torch.randn(batch, HEADS, HEAD_DIM, generator=g, device="cuda").bfloat16()
        # each request's keys where the allocator would put them: consecutive locations
        page_table = torch.arange(batch * ctx_len, device="cuda", dtype=torch.int32).view(
            batch, ctx_len
        )
        rows = torch.randperm(batch, generator=g, device="cuda")
        lo = max(1, ctx_len // 4)  # lengths spread like a real batch's: from a quarter to all of it
        seqlens = torch.randint(
            lo, ctx_len + 1, (batch,), generator=g, device="cuda", dtype=torch.int32
        )
        kv_bytes = int(seqlens.sum()) * KV_HEADS * HEAD_DIM * 2 * 2
        default = num_splits(batch, KV_HEADS)
        splits = sorted({min(16, s) for s in (1, default, 2 * default, max(1, default // 2))})
        grid = itertools.product([32, 64, 128], [4, 8], [1, 2, 3, 4], splits)
        if quick:
            grid = [(64, 4, 2, default), (128, 4, 3, default), (128, 8, 2, default)]
        results = []
        for block_n, warps, stages, splits in grid:
            tune = dict(block_n=block_n, num_warps=warps, num_stages=stages, splits=min(splits, 16))
            try:
                us = bench_us(
                    lambda: paged_decode_attention(
                        q,
                        k_cache,
                        v_cache,
                        page_table,
                        rows,
                        seqlens,
                        1 / math.sqrt(HEAD_DIM),
                        tune,
                    )
                )
            except (
                Exception
            ) as e:  # a setting that does not compile (shared memory) is just skipped
                print(f"    skipped {tune}: {type(e).__name__}")
                continue
            results.append((us, tune))
        results.sort(key=lambda r: r[0])
        base = bench_us(
            lambda: paged_decode_attention(
                q, k_cache, v_cache, page_table, rows, seqlens, 1 / math.sqrt(HEAD_DIM)
            )
        )
        print(
            f"\nattention, batch {batch}, lengths U[{lo}, {ctx_len}] ({kv_bytes / 1e6:.0f} MB "
            "of KV): "
            f"the code's settings {base:.1f} us = {kv_bytes / base / 1e6:.2f} TB/s; the best ones:"
        )
        for us, tune in results[:6]:
            print(f"    {us:8.1f} us  {kv_bytes / us / 1e6:5.2f} TB/s  {base / us:4.2f}x  {tune}")


def linears() -> None:
    print("\nmatrix-vector products (bf16): F.linear vs triton_ops.small_batch_linear")
    total = {"torch": 0.0, "triton": 0.0}
    for m in (1, 2):  # the engine uses the Triton kernel for one row only
        for name, (n, k) in LINEARS.items():
            w = torch.randn(n, k, device="cuda").bfloat16()
            x = torch.randn(m, k, device="cuda").bfloat16()
            want = F.linear(x, w)
            got = triton_ops.small_batch_linear(x, w)
            err = (got.float() - want.float()).abs().max().item()
            t_torch = bench_us(lambda: F.linear(x, w))
            t_triton = bench_us(lambda: triton_ops.small_batch_linear(x, w))
            gb = n * k * 2 / 1e9
            if m == 1:
                total["torch"] += t_torch * PER_STEP[name]
                total["triton"] += t_triton * PER_STEP[name]
            print(
                f"  M={m} {name:13s} {n:6d}x{k:4d}  torch {t_torch:7.1f} us "
                f"{gb / t_torch * 1e3:5.2f} TB/s   "
                f"triton {t_triton:7.1f} us {gb / t_triton * 1e3:5.2f} TB/s  "
                f"({t_torch / t_triton:4.2f}x, "
                f"max diff {err:.3f})"
            )
    print(
        f"  a batch-1 step's products: torch {total['torch']:.0f} us, triton "
        f"{total['triton']:.0f} us"
    )
    print("  Triton settings at M=1, best first:")
    for name, (n, k) in LINEARS.items():
        w = torch.randn(n, k, device="cuda").bfloat16()
        x = torch.randn(1, k, device="cuda").bfloat16()
        timed = []
        for bn, bk, warps in itertools.product([2, 4, 8, 16, 32], [256, 512, 1024, 2048], [4, 8]):
            tune = dict(block_n=bn, block_k=bk, num_warps=warps)
            timed.append((bench_us(lambda: triton_ops.small_batch_linear(x, w, tune)), tune))
        timed.sort(key=lambda r: r[0])
        gb = n * k * 2 / 1e9
        print(
            f"    {name:13s} "
            + "   ".join(f"{us:6.1f} us {gb / us * 1e3:4.2f} TB/s {t}" for us, t in timed[:3])
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="three attention settings only")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    linears()
    attention(args.quick)


if __name__ == "__main__":
    main()
