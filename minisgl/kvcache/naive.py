from __future__ import annotations

from typing import Tuple

import torch

from .base import BasePrefixCache, CacheHandle


class NaivePrefixCache(BasePrefixCache):
    """Caches nothing: every request computes its whole prompt, and all its KV is freed when it
    ends.
    The baseline that the radix cache is measured against."""

    def __init__(self, page_size: int, device: torch.device) -> None:
        self.page_size = page_size
        self._empty = torch.empty(0, dtype=torch.int32, device=device)

    def match_prefix(self, input_ids: torch.Tensor) -> Tuple[CacheHandle, torch.Tensor]:
        return CacheHandle(0), self._empty

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> Tuple[int, CacheHandle]:
        return 0, CacheHandle(0)

    def lock_handle(self, handle: CacheHandle, unlock: bool = False) -> None:
        pass

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens > 0:
            raise RuntimeError(f"cannot evict {num_tokens} tokens: the naive cache holds nothing")
        return self._empty

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def all_indices(self) -> torch.Tensor:
        return self._empty

    def check_integrity(self) -> None:
        pass
