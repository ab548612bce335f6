"""Reference implementations of the engine's math in plain torch. Every layer calls these, so there is
one place to read (and, on a GPU, one place to swap for a faster kernel)."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 like Hugging Face does."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Add the residual, then normalize: returns (rms_norm(x + residual), x + residual). Fusing saves
    one pass over memory on a GPU; here it just keeps the call sites short."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def apply_rope_neox(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Rotate `x` [tokens, heads, head_dim] by the angles whose cos/sin are [tokens, head_dim // 2].
    NeoX layout: the first half of head_dim pairs with the second half (not even/odd)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    return torch.cat([out1, out2], dim=-1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: x holds [gate | up] side by side; returns silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
