from __future__ import annotations

import torch

from .base import BasePrefixCache, CacheHandle
from .naive import NaivePrefixCache
from .pool import KVCache
from .radix import RadixNode, RadixPrefixCache


def create_prefix_cache(cache_type: str, page_size: int, device: torch.device) -> BasePrefixCache:
    if cache_type == "radix":
        return RadixPrefixCache(page_size, device)
    if cache_type == "naive":
        return NaivePrefixCache(page_size, device)
    raise ValueError(f"cache_type must be 'radix' or 'naive', got {cache_type!r}")


__all__ = [
    "BasePrefixCache",
    "CacheHandle",
    "NaivePrefixCache",
    "KVCache",
    "RadixNode",
    "RadixPrefixCache",
    "create_prefix_cache",
]
