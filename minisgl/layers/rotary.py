from __future__ import annotations

from typing import Tuple

import torch

from minisgl.kernel import apply_rope_neox


class RotaryEmbedding:
    """NeoX-style rotary position embedding with a precomputed cos/sin table.

    Not a BaseOP: the table is derived from the config, never loaded from a checkpoint."""

    def __init__(self, head_dim: int, max_position: int, base: float, device: torch.device) -> None:
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
        t = torch.arange(max_position, dtype=torch.float32, device=device)
        freqs = torch.outer(t, inv_freq)  # [max_position, head_dim // 2]
        self._cos = freqs.cos()
        self._sin = freqs.sin()

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        cos = self._cos[positions].to(q.dtype)
        sin = self._sin[positions].to(q.dtype)
        return apply_rope_neox(q, cos, sin), apply_rope_neox(k, cos, sin)
