"""Which attention backend an engine uses: the plain-torch reference on a CPU (and wherever asked
for), the Triton paged-decode backend on a CUDA GPU when Triton is installed."""

from __future__ import annotations

import importlib.util
import sys
from typing import Tuple

import torch

from .torch_backend import TorchAttentionBackend

BACKENDS = ("auto", "torch", "triton")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


# The Triton kernels' limits (minisgl/kernel/triton_*.py):
# power-of-two head sizes from 16 (whole tiles, and the fused RoPE's half head), at most 16 query
# heads per KV head (one tensor-core tile of heads).
TRITON_MAX_GROUP = 16


def triton_unsupported(num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    """Why the Triton kernels cannot run attention of this shape, or None if they can."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not a power of two >= 16"
    if num_heads // num_kv_heads > TRITON_MAX_GROUP:
        return (
            f"{num_heads // num_kv_heads} query heads share a KV head (at most {TRITON_MAX_GROUP})"
        )
    return None


def resolve_backend_name(
    name: str, device: torch.device, shape: Tuple[int, int, int] | None = None
) -> str:
    """'auto' -> 'torch' or 'triton' for `device`; 'torch' and 'triton' as asked, if possible there.
    `shape` = (query heads, KV heads, head_dim): 'auto' falls back to torch, with a one-line notice,
    for a shape the Triton kernels cannot run, and 'triton' asked for such a shape is a ValueError.
    (The engine's default, MINISGL_ATTENTION_BACKEND, is applied by the caller: minisgl.env.)"""
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {name!r}")
    if name == "triton" and device.type != "cuda":
        raise ValueError("the triton attention backend needs a CUDA device")
    resolved = name
    if name == "auto":
        resolved = "triton" if device.type == "cuda" and triton_available() else "torch"
    why = triton_unsupported(*shape) if resolved == "triton" and shape is not None else None
    if why is None:
        return resolved
    if name == "triton":
        raise ValueError(
            f"the triton attention backend cannot run this model: {why}; use "
            "attention_backend='torch'"
        )
    print(
        f"minisgl: {why}, which the Triton kernels do not run: using the torch attention backend",
        file=sys.stderr,
    )
    return "torch"


def create_attention_backend(
    name: str, kv_cache, num_heads: int, num_kv_heads: int, head_dim: int, page_table: torch.Tensor
):
    resolved = resolve_backend_name(name, page_table.device)
    if resolved == "triton":
        from .triton_backend import TritonAttentionBackend  # imports triton: GPU machines only

        return TritonAttentionBackend(kv_cache, num_heads, num_kv_heads, head_dim, page_table)
    return TorchAttentionBackend(kv_cache, num_heads, num_kv_heads, head_dim)
