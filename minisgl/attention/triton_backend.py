"""The GPU attention backend: the reference backend's prefill, and decode through the paged Triton
kernel (triton_decode.py), which reads each request's own KV locations straight from the engine's
page table and can be captured in a CUDA graph."""

from __future__ import annotations

import torch

from minisgl.core import Batch

from .torch_backend import TorchAttentionBackend
from .triton_decode import paged_decode_attention


class TritonAttentionBackend(TorchAttentionBackend):
    def __init__(self, kv_cache, num_heads: int, num_kv_heads: int, head_dim: int,
                 page_table: torch.Tensor) -> None:
        super().__init__(kv_cache, num_heads, num_kv_heads, head_dim)
        self.page_table = page_table  # the engine's whole [rows, max_seq_len] table

    def _decode(self, q: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        if meta.rows is not None:
            table, rows = self.page_table, meta.rows
        else:  # metadata without rows (a learner's prepare_metadata): its gathered slice will do
            table = meta.page_table
            rows = torch.arange(table.shape[0], device=table.device)
        return paged_decode_attention(q, self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id),
                                      table, rows, meta.cache_seqlens, self.scale)
