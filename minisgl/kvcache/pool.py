"""The KV cache: one buffer for every layer's keys and values.

Layout [2, layers, pages, page_size, kv_heads, head_dim]. A token's KV lives at a *location*
`page * page_size + offset`; flattening pages and page_size gives one row per location, which is
how attention addresses it. One buffer (not one per layer) means one allocation and one number to
size from free memory.
"""

from __future__ import annotations

import math

import numpy as np
import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        shape = (2, num_layers, num_pages, page_size, num_kv_heads, head_dim)
        if device.type == "cpu":
            self.buffer = untouched_zeros(shape, dtype)
        else:
            self.buffer = torch.zeros(shape, dtype=dtype, device=device)
        # [2, layers, locations, kv_heads, head_dim]: a view, no copy
        self._flat = self.buffer.view(2, num_layers, num_pages * page_size, num_kv_heads, head_dim)

    @property
    def num_locations(self) -> int:
        return self.num_pages * self.page_size

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._flat[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._flat[1, layer_id]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write the keys and values of the tokens just computed to their locations in one layer.

        A location is page * page_size + offset: one row of the flattened cache, which is how
        `k_cache(layer)` and `v_cache(layer)` index it.

        Receives: `k`, `v` [tokens, kv_heads, head_dim] in the cache's dtype; `out_loc` [tokens],
            one location per token (int64 or int32, on the cache's device); `layer_id`.
        Returns: nothing.
        Leaves: `self.buffer` holding token i's key and value at location `out_loc[i]` of layer
            `layer_id` (an earlier value there is overwritten); every other entry unchanged.
        Uses: `self.k_cache`, `self.v_cache` (views of `self.buffer` by location; ch04).
        Checked: each token lands at its page and offset; a reused location is overwritten; the
            views by location read back what was stored.
        """
        self._flat[0, layer_id][out_loc] = k
        self._flat[1, layer_id][out_loc] = v

    @staticmethod
    def bytes_per_page(
        num_layers: int, page_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * page_size * num_kv_heads * head_dim * dtype.itemsize


def untouched_zeros(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros whose memory is not written now. The pool must read as zeros (a padded
    gather reads locations nobody stored, and garbage there could be NaN, which the mask does not
    cancel), but torch.zeros writes every byte: 0.15-1.5 s and 400 MB resident for the bundled
    model's default pool, 15 GB for Qwen3-0.6B's. numpy's zeros asks calloc, which maps fresh pages
    the OS hands out zeroed, so the pool costs time and memory only as tokens fill it."""
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
