"""Which attention backend an engine uses: the plain-torch reference on a CPU (and wherever asked
for), the Triton paged-decode backend on a CUDA GPU when Triton is installed."""

from __future__ import annotations

import importlib.util

import torch

from .torch_backend import TorchAttentionBackend

BACKENDS = ("auto", "torch", "triton")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend_name(name: str, device: torch.device) -> str:
    """'auto' -> 'torch' or 'triton' for `device`; 'torch' and 'triton' as asked, if possible there.
    (The engine's default, MINISGL_ATTENTION_BACKEND, is applied by the caller: minisgl.env.)"""
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if name == "triton" and device.type != "cuda":
        raise ValueError("the triton attention backend needs a CUDA device")
    return name


def create_attention_backend(name: str, kv_cache, num_heads: int, num_kv_heads: int, head_dim: int,
                             page_table: torch.Tensor):
    resolved = resolve_backend_name(name, page_table.device)
    if resolved == "triton":
        from .triton_backend import TritonAttentionBackend  # imports triton: GPU machines only

        return TritonAttentionBackend(kv_cache, num_heads, num_kv_heads, head_dim, page_table)
    return TorchAttentionBackend(kv_cache, num_heads, num_kv_heads, head_dim)
