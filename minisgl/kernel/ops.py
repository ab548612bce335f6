"""Reference implementations of the engine's math in plain torch. Every layer calls these, so there
is
one place to read (and, on a GPU, one place to swap for a faster kernel)."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalize each vector of `x` (its last dimension) to unit root-mean-square, then scale it.

    y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back to x's dtype before
    the weight is applied, exactly as Hugging Face does, so low-precision inputs agree with it.

    Receives: `x` [..., dim] in any float dtype (tokens x hidden, or tokens x heads x head_dim for
        the per-head norms); `weight` [dim]; `eps`, a small float.
    Returns: a tensor shaped like x, in the dtype x and weight promote to.
    Leaves: nothing changed (a pure function; x is not modified).
    Uses: only torch (`fused_add_rms_norm` and `RMSNorm` call this function).
    Checked: equals Hugging Face's RMSNorm, plain and fused with the residual, and per head.
    """
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Add the residual, then normalize: returns (rms_norm(x + residual), x + residual). Fusing
    saves
    one pass over memory on a GPU; here it just keeps the call sites short."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def apply_rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` by the angles whose cosines and sines are given, in the NeoX layout.

    NeoX pairs dimension i of the first half of head_dim with dimension i of the second half (not
    even with odd), and rotates each pair by its angle; every head of a token turns alike.

    Receives: `x` [tokens, heads, head_dim]; `cos`, `sin` [tokens, head_dim // 2], one row per token
        (already looked up for its position).
    Returns: a new tensor shaped like x.
    Leaves: nothing changed (a pure function).
    Uses: only torch (`RotaryEmbedding` computes cos and sin and calls this function).
    Checked: equals Hugging Face's rotary embedding; each first-half / second-half pair is rotated
        by its angle.
    """
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
