"""Tensor parallelism, at size 1. The engine calls these at the points where a multi-GPU build
would communicate; with one device they do nothing, which keeps the call sites honest."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    @property
    def is_primary(self) -> bool:
        return self.rank == 0


_TP = TPInfo()


def get_tp_info() -> TPInfo:
    return _TP


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over tensor-parallel ranks: the identity at size 1."""
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate over tensor-parallel ranks: the identity at size 1."""
    return x
