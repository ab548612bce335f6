"""Batch 64's projections on Qwen3-0.6B's shape: cuBLAS (what the engine runs from two rows on)
against a plain Triton tl.dot kernel (W's rows on the MMA's M side, split-K through float32
atomics), over a sweep of its block sizes. Each shape's 28 layers get 28 distinct weights (so L2
never holds them) and are replayed as one CUDA graph; prints microseconds per 28 calls, TB/s and
the best Triton settings. GPU only:  python benchmarks/projections_batch64.py [rows, default 64]

Why it exists: chapter 19 says batch 64's projections read their weights at about a third of the
memory's speed; this shows whether a hand-written kernel would do better (2026-12-05: no; the
time per call is mostly a fixed few microseconds, see benchmarks/results)."""

import itertools
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _k(
    X,
    W,
    Y,
    P,
    M,
    N,
    K,
    k_per,
    BN: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    ATOMIC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    n_ok = n < N
    m_ok = m < M
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    k_lo = pid_k * k_per
    for k0 in range(k_lo, k_lo + k_per, BK):
        k = k0 + tl.arange(0, BK)
        w = tl.load(W + n[:, None].to(tl.int64) * K + k[None, :], mask=n_ok[:, None], other=0.0)
        x = tl.load(X + m[:, None] * K + k[None, :], mask=m_ok[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    out = tl.trans(acc)  # [BM, BN]
    if ATOMIC:
        tl.atomic_add(
            P + m[:, None] * N + n[None, :], out, mask=m_ok[:, None] & n_ok[None, :], sem="relaxed"
        )
    else:
        tl.store(
            Y + m[:, None] * N + n[None, :],
            out.to(Y.dtype.element_ty),
            mask=m_ok[:, None] & n_ok[None, :],
        )


def run_triton(x, w, y, p, bn, bk, split, stages, warps):
    M, K = x.shape
    N = w.shape[0]
    k_per = K // split
    grid = (triton.cdiv(N, bn), split)
    if split > 1:
        p.zero_()
    _k[grid](
        x,
        w,
        y,
        p,
        M,
        N,
        K,
        k_per,
        BN=bn,
        BM=64,
        BK=bk,
        ATOMIC=split > 1,
        num_stages=stages,
        num_warps=warps,
    )
    if split > 1:
        y.copy_(p)


def time_graph(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1000  # us per replay


def main():
    M = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    L = 28
    shapes = {
        "qkv": (4096, 1024),
        "o": (1024, 2048),
        "gate_up": (6144, 1024),
        "down": (1024, 3072),
        "lm_head": (151936, 1024),
    }
    torch.manual_seed(0)
    best_total = 0.0
    cublas_total = 0.0
    for name, (N, K) in shapes.items():
        layers = 1 if name == "lm_head" else L
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ys = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        p = torch.empty(M, N, device="cuda", dtype=torch.float32)
        gb = N * K * 2 * layers / 1e9
        ref = [torch.nn.functional.linear(x, w) for w in ws]
        t_cublas = time_graph(lambda: [torch.nn.functional.linear(x, w, out=None) for w in ws])
        cublas_total += t_cublas
        print(
            f"{name:8s} N={N} K={K} x{layers}: "
            f"cuBLAS {t_cublas:8.1f} us  {gb / t_cublas * 1e3:5.2f} TB/s",
            flush=True,
        )
        results = []
        for bn, bk, split, stages, warps in itertools.product(
            (64, 128), (64, 128, 256), (1, 2, 4, 8), (3, 4), (4,)
        ):
            if K // split < bk or (K // split) % bk:
                continue
            try:
                run_triton(x, ws[0], ys[0], p, bn, bk, split, stages, warps)
                torch.cuda.synchronize()
                err = (ys[0].float() - ref[0].float()).abs().max().item()
                t = time_graph(
                    lambda: [
                        run_triton(x, w, yy, p, bn, bk, split, stages, warps)
                        for w, yy in zip(ws, ys)
                    ]
                )
            except Exception as e:  # noqa: BLE001
                print("   fail", bn, bk, split, stages, warps, type(e).__name__, str(e)[:80])
                continue
            results.append((t, bn, bk, split, stages, warps, err))
        results.sort()
        for t, bn, bk, split, stages, warps, err in results[:4]:
            print(
                f"   triton bn={bn} bk={bk} split={split} stages={stages} warps={warps}: "
                f"{t:8.1f} us  "
                f"{gb / t * 1e3:5.2f} TB/s  ({t_cublas / t:4.2f}x cuBLAS) err {err:.3g}",
                flush=True,
            )
        if results:
            best_total += min(results[0][0], t_cublas)
    print(f"total: cuBLAS {cublas_total:.1f} us, best of both {best_total:.1f} us")


if __name__ == "__main__":
    main()
