from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Tuple

import torch

from minisgl.kernel import apply_rope_neox

if TYPE_CHECKING:  # the layers do not depend on the model package at run time
    from minisgl.models.config import RopeScaling


class RotaryEmbedding:
    """NeoX-style rotary position embedding with a precomputed cos/sin table.

    Not a BaseOP: the table is derived from the config, never loaded from a checkpoint."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float,
        device: torch.device,
        scaling: "RopeScaling | None" = None,
    ) -> None:
        inv_freq = 1.0 / (
            base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
        )
        if scaling is not None:
            inv_freq = llama3_scaled(inv_freq, scaling)
        self._inv_freq = inv_freq
        self._step_rows: Tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.resize(max_position, device)

    @property
    def max_position(self) -> int:
        return self._cos.shape[0]

    def resize(self, max_position: int, device: torch.device) -> None:
        """Recompute the table for positions [0, max_position) on `device`. The engine sizes it by
        its context length, not by the model's limit (which may be 2**31 - 1)."""
        inv_freq = self._inv_freq.to(device)
        t = torch.arange(max_position, dtype=torch.float32, device=device)
        freqs = torch.outer(t, inv_freq)  # [max_position, head_dim // 2]
        self._cos = freqs.cos()
        self._sin = freqs.sin()

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        held = self._step_rows
        if held is not None and held[0] is positions and held[1].dtype == q.dtype:
            cos, sin = held[1], held[2]
        else:
            cos = self._cos[positions].to(q.dtype)
            sin = self._sin[positions].to(q.dtype)
        return apply_rope_neox(q, cos, sin), apply_rope_neox(k, cos, sin)

    @contextmanager
    def rows_held(self, positions: torch.Tensor, dtype: torch.dtype) -> Iterator[None]:
        """Look up the cos and sin rows of `positions` once, for every layer of one forward.
        Each op costs Python and dispatch time, which on a CPU is most of a small model's step:
        six layers need not index the table six times. Released when the forward ends."""
        self._step_rows = (
            positions,
            self._cos[positions].to(dtype),
            self._sin[positions].to(dtype),
        )
        try:
            yield
        finally:
            self._step_rows = None


def llama3_scaled(inv_freq: torch.Tensor, s: "RopeScaling") -> torch.Tensor:
    """Llama 3.1's frequencies for long contexts: a frequency whose wavelength is longer than
    original_max_position_embeddings / low_freq_factor turns `factor` times slower, one shorter than
    .../ high_freq_factor stays, and the band between moves smoothly from one to the other."""
    old_len = s.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    slow = torch.where(wavelen > old_len / s.low_freq_factor, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * slow / s.factor + smooth * slow
    medium = (wavelen >= old_len / s.high_freq_factor) & (wavelen <= old_len / s.low_freq_factor)
    return torch.where(medium, blended, slow)
