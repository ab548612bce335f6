"""Matmul weights laid out for a CPU's one-row-at-a-time decode.

`F.linear(x, W)` computes x @ W^T. With W stored as PyTorch makes it ([out, in], row-major), a
decode step of one or a few rows runs the BLAS's slower transposed path; with the same numbers
stored column-major (W^T contiguous, W a transposed view of it) it runs the plain x @ W^T product,
which on the 2-core CI machine makes a decode step at batch 1 ~25 % cheaper (benchmarks/results/
2026-12-03-cpu-step-cost.txt). Only the strides change: every value, shape and dtype stays, so
the layers, the state dict and the exercises see the same weights. A GPU keeps its layout (its
fused kernels and cuBLAS want row-major)."""

from __future__ import annotations

import torch

from .base import BaseOP, OPList
from .embedding import LMHead
from .linear import Linear


def column_major(w: torch.Tensor) -> torch.Tensor:
    """The same [out, in] matrix, stored so that its transpose is contiguous."""
    return w.t().contiguous().t()


def _children(op: BaseOP) -> list[BaseOP]:
    if isinstance(op, OPList):
        return list(op)
    return [v for k, v in op.__dict__.items() if not k.startswith("_") and isinstance(v, BaseOP)]


def lay_out_for_cpu(op: BaseOP) -> int:
    """Re-store the weight of every Linear and LM head under `op` (a tied head's is its
    embedding's) column-major, in place; returns how many weights moved. Call once the weights
    are loaded: a later load puts row-major tensors back, which stays correct, only slower."""
    owners: list[BaseOP] = []
    stack = [op]
    while stack:
        cur = stack.pop()
        if isinstance(cur, Linear):
            owners.append(cur)
        elif isinstance(cur, LMHead):
            owners.append(cur.tied_to if cur.tied_to is not None else cur)
        stack.extend(_children(cur))
    moved = 0
    for owner in {id(o): o for o in owners}.values():
        w = owner.weight
        if w.dim() == 2 and not w.is_cuda and not w.t().is_contiguous():
            owner.weight = column_major(w)
            moved += 1
    return moved
