"""The sparse MLP of a mixture-of-experts layer (Qwen3-MoE): a router and stacked experts.

Keys follow transformers 5's layout: `mlp.gate.weight` [experts, hidden] (the router),
`mlp.experts.gate_up_proj` [experts, 2 * inter, hidden] and `mlp.experts.down_proj`
[experts, hidden, inter]; the loader stacks transformers 4's per-expert weights into them
(minisgl/models/expert_weights.py).

Tensor parallelism (minisgl/models/sharding.py): the experts shard by their intermediate
dimension, like the dense MLP. Rank r of n keeps rows [r * inter / n, (r + 1) * inter / n) of each
expert's gate and of its up (`gate_up_shard`) and the same columns of down; the router is
replicated, so every rank routes alike, and the block's output is the all-reduced sum of the
ranks' partial outputs.
"""

from __future__ import annotations

from typing import Callable

import torch

from minisgl.distributed import SINGLE
from minisgl.kernel.dispatch import fused_for
from minisgl.kernel.moe import moe_experts, moe_experts_dense, route
from minisgl.layers import BaseOP, Linear

from .moe_config import MoeConfig


class Experts(BaseOP):
    def __init__(
        self, num: int, hidden: int, inter: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.gate_up_proj = torch.empty(num, 2 * inter, hidden, dtype=dtype, device=device)
        self.down_proj = torch.empty(num, hidden, inter, dtype=dtype, device=device)


class SparseMoeBlock(BaseOP):
    def __init__(
        self, moe: MoeConfig, layer_id: int, hidden: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self._moe, self._layer_id = moe, layer_id
        # called with (layer_id, ids) after each routing when set: the notebook's view of how
        # tokens spread over the experts (classroom/experts.py); None in serving
        self._on_route: Callable[[int, torch.Tensor], None] | None = None
        self.gate = Linear(hidden, moe.num_experts, False, dtype, device)
        self.experts = Experts(moe.num_experts, hidden, moe.intermediate_size, dtype, device)
        self._comm = SINGLE  # under tensor parallelism, the ranks' partial outputs are summed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._comm.all_reduce(self._experts_forward(x))

    def _experts_forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate.forward(x), self._moe.top_k, self._moe.norm_topk_prob)
        if self._on_route is not None:
            self._on_route(self._layer_id, ids)
        gate_up, down = self.experts.gate_up_proj, self.experts.down_proj
        if fused_for(x) is not None:  # a GPU engine with fused kernels: one Triton launch
            from minisgl.kernel.triton_moe import fused_moe

            return fused_moe(x, gate_up, down, weights, ids)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return moe_experts_dense(x, gate_up, down, weights, ids)  # a graph cannot sync
        return moe_experts(x, gate_up, down, weights, ids)


def gate_up_shard(gate_up: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s slice of stacked experts' gate_up [experts, 2 * inter, hidden] under tensor
    parallelism over `world` ranks: the same rows of every expert's gate and of its up, still
    gate above up. (down_proj [experts, hidden, inter] takes the matching columns.)"""
    inter = gate_up.shape[1] // 2
    if inter % world:
        raise ValueError(f"moe_intermediate_size {inter} does not split over {world} ranks")
    part = inter // world
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    rows = slice(rank * part, (rank + 1) * part)
    return torch.cat([gate[:, rows], up[:, rows]], dim=1)
