"""The GPU attention backend: prefill and decode through the paged Triton kernels of
minisgl/kernel/ (triton_prefill.py, triton_decode.py), which read each request's own KV locations
straight from the engine's page table: one launch per layer whatever the batch, and decode's can
be captured in a CUDA graph."""

from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.kernel.triton_decode import paged_decode_attention
from minisgl.kernel.triton_prefill import paged_prefill_attention

from .torch_backend import TorchAttentionBackend


class TritonAttentionBackend(TorchAttentionBackend):
    def __init__(
        self, kv_cache, num_heads: int, num_kv_heads: int, head_dim: int, page_table: torch.Tensor
    ) -> None:
        super().__init__(kv_cache, num_heads, num_kv_heads, head_dim)
        self.page_table = page_table  # the engine's whole [rows, max_seq_len] table

    def _table_and_rows(self, batch: Batch):
        meta = batch.attn_metadata
        if meta.rows is not None:
            return self.page_table, meta.rows
        # metadata without rows (a learner's prepare_metadata): its gathered slice will do
        return meta.page_table, torch.arange(
            meta.page_table.shape[0], device=meta.page_table.device
        )

    def _prefill(self, q: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        table, rows = self._table_and_rows(batch)
        return paged_prefill_attention(
            q,
            self.kv_cache.k_cache(layer_id),
            self.kv_cache.v_cache(layer_id),
            table,
            rows,
            meta.cu_seqlens_q,
            meta.cache_seqlens,
            meta.max_seqlen_q,
            self.scale,
        )

    def _decode(self, q: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        table, rows = self._table_and_rows(batch)
        return paged_decode_attention(
            q,
            self.kv_cache.k_cache(layer_id),
            self.kv_cache.v_cache(layer_id),
            table,
            rows,
            batch.attn_metadata.cache_seqlens,
            self.scale,
        )
