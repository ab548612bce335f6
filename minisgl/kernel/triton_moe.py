"""A fused mixture-of-experts MLP in Triton: every expert's matrix product in one kernel launch.

The torch path (moe.py) loops over experts on the host, one launch or three per expert and a
host sync to learn how many tokens each got. Here the router's choices are laid out on the device
so that one launch covers every expert:

1. `align_by_expert` sorts the flat choices (token t's choice j is entry t * top_k + j) by expert
   and pads each expert's run to a multiple of BLOCK_M, so each block of BLOCK_M sorted entries
   belongs to one expert; `block_expert` names it (-1 for a block past the end). No host sync: the
   grid is sized by the most blocks the routing could need, and blocks past the end return.
2. `_grouped_matmul` computes, for each block and tile of output columns, rows of A (the
   entries' tokens, or the entries' own rows) times that block's expert's weight, optionally
   scaled by the router's weight of each entry, and writes each row to its entry.
3. gate_up, silu(gate) * up, down, then the top_k rows of each token are summed.

With TRITON_INTERPRET=1 set before triton is imported, the same kernel runs on CPU tensors
(slowly): tests/test_moe.py checks it that way against the torch path.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
import triton
import triton.language as tl

from .ops import silu_and_mul
from .triton_launch import launch, settings


def align_by_expert(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sorted_entries, block_expert): the flat entries of `ids` [tokens, top_k] grouped by
    expert, each expert's group padded to a multiple of `block_m` with the entry count (an entry
    that does not exist); block_expert[b] is the expert of block b, -1 past the last block used."""
    flat = ids.reshape(-1)
    n = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert_of_sorted = flat[order]
    first_sorted = torch.cumsum(counts, 0) - counts  # where each expert's entries start, unpadded
    rank = torch.arange(n, device=ids.device) - first_sorted[expert_of_sorted]
    dest = padded_end[expert_of_sorted] - padded[expert_of_sorted] + rank
    max_blocks = (n + min(n, num_experts) * (block_m - 1) + block_m - 1) // block_m
    sorted_entries = torch.full((max_blocks * block_m,), n, dtype=torch.int64, device=ids.device)
    sorted_entries[dest] = order
    block_start = torch.arange(max_blocks, device=ids.device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_entries, block_expert


@triton.jit
def _grouped_matmul(
    A,  # [rows, K]: row r of entry e is e // A_ROW_DIV
    W,  # [experts, N, K]
    Out,  # [entries, N]
    RouteW,  # [entries] float32, the router's weight of each entry
    SortedEntries,
    BlockExpert,
    num_entries,
    stride_am,
    stride_we,
    stride_wn,
    stride_wk,
    stride_om,
    N: tl.constexpr,  # constexpr: the shapes are the model's, and the interpreter loops over K
    K: tl.constexpr,
    A_ROW_DIV: tl.constexpr,
    MUL_ROUTE_WEIGHT: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32 rounding), "tf32" otherwise (unused)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(BlockExpert + block)
    if expert < 0:
        return
    entries = tl.load(SortedEntries + block * BLOCK_M + tl.arange(0, BLOCK_M))
    real = entries < num_entries
    rows = entries // A_ROW_DIV
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = tl.load(
            A + rows[:, None] * stride_am + kk[None, :],
            mask=real[:, None] & (kk[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            W + expert * stride_we + cols[None, :] * stride_wn + kk[:, None] * stride_wk,
            mask=(cols[None, :] < N) & (kk[:, None] < K),
            other=0.0,
        )
        acc += tl.dot(a, w, input_precision=PRECISION)
    res = acc.to(Out.dtype.element_ty)
    if MUL_ROUTE_WEIGHT:
        # rounded as the torch path (and transformers) round: the product in the tokens' dtype,
        # then times the weight cast to it
        route_w = tl.load(RouteW + entries, mask=real, other=0.0).to(Out.dtype.element_ty)
        res = (res * route_w[:, None]).to(Out.dtype.element_ty)
    tl.store(
        Out + entries[:, None] * stride_om + cols[None, :],
        res,
        mask=real[:, None] & (cols[None, :] < N),
    )


def _launch(a, w, out, route_w, sorted_entries, block_expert, row_div, mul, block_m, tuning):
    n, k = w.shape[1], w.shape[2]
    meta = settings({"BLOCK_N": 64, "BLOCK_K": 32 if k <= 32 else 64, "num_warps": 4}, tuning)
    grid = (block_expert.numel(), triton.cdiv(n, meta["BLOCK_N"]))
    launch(
        _grouped_matmul,
        grid,
        a,
        w,
        out,
        route_w,
        sorted_entries,
        block_expert,
        out.shape[0],
        a.stride(0),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        N=n,
        K=k,
        A_ROW_DIV=row_div,
        MUL_ROUTE_WEIGHT=mul,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m,
        **meta,
    )


def fused_moe(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    block_m: int | None = None,
    tuning: Dict[str, Any] | None = None,
) -> torch.Tensor:
    """What `minisgl.kernel.moe.moe_experts` computes (same arguments, same result within
    rounding), in two launches of one grouped matrix-product kernel and no host sync. `block_m`,
    the entries one program multiplies: 16 for decode-sized batches (little padding per expert),
    64 from 1024 entries on (more reuse of each weight tile). `tuning`: BLOCK_N, BLOCK_K or
    num_warps other than the defaults (benchmarks/moe_bench.py)."""
    tokens, top_k = ids.shape
    if block_m is None:
        block_m = 16 if tokens * top_k < 1024 else 64
    if tokens == 0:
        return torch.zeros_like(x)
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    sorted_entries, block_expert = align_by_expert(ids, gate_up.shape[0], block_m)
    route_w = weights.reshape(-1).float().contiguous()
    h = torch.empty(tokens * top_k, gate_up.shape[1], dtype=x.dtype, device=x.device)
    _launch(x, gate_up, h, route_w, sorted_entries, block_expert, top_k, False, block_m, tuning)
    act = silu_and_mul(h).contiguous()
    y = torch.empty(tokens * top_k, x.shape[1], dtype=x.dtype, device=x.device)
    _launch(act, down, y, route_w, sorted_entries, block_expert, 1, True, block_m, tuning)
    return y.view(tokens, top_k, -1).sum(dim=1)
