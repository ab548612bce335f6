"""What every prefix cache offers the cache manager.

Sizes are counted in tokens (locations); the cache manager converts to pages. A *handle* names a
cached prefix; while a handle is locked its tokens cannot be evicted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Tuple

import torch


@dataclass
class CacheHandle:
    cached_len: int  # how many tokens of the request this handle covers
    node: Any = None  # the cache's own bookkeeping (a radix node), opaque to everyone else


class BasePrefixCache(ABC):
    page_size: int

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor) -> Tuple[CacheHandle, torch.Tensor]:
        """Longest cached (page-aligned) prefix of `input_ids`: its handle and the KV locations."""

    @abstractmethod
    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> Tuple[int, CacheHandle]:
        """Offer the cache `input_ids` whose KV lives at `indices`. Returns (prefix_len, handle):
        the first `prefix_len` tokens were already cached elsewhere (the caller's copies of them are
        duplicates it should free); the handle covers everything the cache now holds of the
        request."""

    @abstractmethod
    def lock_handle(self, handle: CacheHandle, unlock: bool = False) -> None:
        """Protect (or stop protecting) a prefix from eviction. Locks nest."""

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop unlocked entries until at least `num_tokens` locations are freed; returns them."""

    @property
    @abstractmethod
    def evictable_size(self) -> int: ...

    @property
    @abstractmethod
    def protected_size(self) -> int: ...

    @property
    def size(self) -> int:
        return self.evictable_size + self.protected_size

    @abstractmethod
    def all_indices(self) -> torch.Tensor:
        """Every location the cache holds (for integrity checks)."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError if the cache's bookkeeping contradicts its contents."""

    def unlock_all(self) -> None:
        """Drop every lock, with no request running (after an interrupted run). A cache that
        keeps no locks has nothing to do."""
