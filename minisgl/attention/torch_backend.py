"""The reference attention backend, in plain torch: store this step's K/V in the paged cache, then
let each request's queries attend over all of its cached keys (causally for the new tokens).

Prefill handles one request at a time (their lengths differ). Decode — one query per request —
runs as one batched, masked computation over the padded page table, with no Python loop, so it is
as fast as torch allows and can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minisgl.core import Batch
from minisgl.kvcache import KVCache


class TorchAttentionBackend:
    def __init__(self, kv_cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.kv_cache = kv_cache
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]. Returns like q."""
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        return self.attend(q, layer_id, batch)

    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        """Attention alone, once this step's K/V are in the cache (the GPU's fused kernel stores
        them on its own)."""
        if batch.is_decode:
            return self._decode(q, layer_id, batch)
        return self._prefill(q, layer_id, batch)

    def _prefill(self, q: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        """Attend each request's new queries over its cached and new keys, causally.

        Requests differ in length, so each is handled on its own: its queries are a slice of `q`,
        its keys and values are read from the cache through its page-table row. Query j of a request
        with len_q queries and len_k keys sits at position len_k - len_q + j and sees keys 0 .. that
        position.

        Receives: `q` [tokens, heads, head_dim], the batch's new queries, request after request;
            `layer_id`; `batch` with `attn_metadata` (cu_seqlens_q, cache_seqlens, page_table; the
            host copies `cu_seqlens_q_host` and `cache_seqlens_host` may be None). This step's keys
            and values are already in the cache (`forward` stored them).
        Returns: [tokens, heads, head_dim], like q, each request's rows in its slice.
        Leaves: nothing changed (reads the KV cache only).
        Uses: `self.kv_cache.k_cache` and `.v_cache` (ch04), `self.scale`, `self.group` (or
            `enable_gqa`), `F.scaled_dot_product_attention`; `Tensor.index_select` gathers rows
            faster than indexing on a CPU.
        Checked: equals dense causal attention with cached prefixes (page size 1 and 4); a request
            never sees another request's keys, nor keys past its own length; it works with prepared
            metadata.
        """
        meta = batch.attn_metadata
        k_cache, v_cache = self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id)
        # Host-side copies when the metadata carries them: `.tolist()` on a GPU tensor waits for
        # the GPU, which would stall the scheduler behind the step in flight.
        cu = (
            meta.cu_seqlens_q_host
            if meta.cu_seqlens_q_host is not None
            else meta.cu_seqlens_q.tolist()
        )
        lens_k = (
            meta.cache_seqlens_host
            if meta.cache_seqlens_host is not None
            else meta.cache_seqlens.tolist()
        )
        out = torch.empty_like(q)
        for i in range(len(lens_k)):
            qi = q[cu[i] : cu[i + 1]]  # [Lq, H, D]
            len_q, len_k = qi.shape[0], lens_k[i]
            locs = meta.page_table[i, :len_k]
            ki, vi = k_cache.index_select(0, locs), v_cache.index_select(0, locs)  # [Lk, Hkv, D]
            # query j sits at absolute position len_k - len_q + j and sees keys 0..that position
            qpos = torch.arange(len_k - len_q, len_k, device=q.device).unsqueeze(1)
            mask = torch.arange(len_k, device=q.device).unsqueeze(0) <= qpos  # [Lq, Lk]
            oi = F.scaled_dot_product_attention(
                qi.transpose(0, 1),
                ki.transpose(0, 1),
                vi.transpose(0, 1),
                attn_mask=mask,
                scale=self.scale,
                enable_gqa=True,
            )
            out[cu[i] : cu[i + 1]] = oi.transpose(0, 1)
        return out

    def _decode(self, q: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        """Attend each request's one new query over all its keys, the whole batch at once.

        In decode every request has exactly one query, the last position of its sequence, so nothing
        inside a request is masked: only the padding of the shorter rows is. One batched
        computation, no Python loop, so it can be captured in a CUDA graph.

        Receives: `q` [B, heads, head_dim], one query per request; `layer_id`; `batch` with
            `attn_metadata`: `page_table` [B, max_k] (entries past a request's length are junk) and
            `cache_seqlens` [B]. This step's keys and values are already in the cache.
        Returns: [B, heads, head_dim], like q.
        Leaves: nothing changed (reads the KV cache only).
        Uses: `self.kv_cache.k_cache` and `.v_cache` (ch04), `self.scale`, `self.group` (or
            `enable_gqa`), `F.scaled_dot_product_attention`; `Tensor.index_select` gathers rows
            faster than indexing on a CPU.
        Checked: equals dense causal attention for a decode batch of different lengths (page size 1
            and 4), also with prepared metadata.
        """
        meta = batch.attn_metadata
        k_cache, v_cache = self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id)
        locs = meta.page_table  # [B, max_k]; entries past a request's length are ignored
        # The rows k_cache[locs] would give, [B, max_k, Hkv, D], fetched through the flat list of
        # locations: index_select copies whole rows where a 2-D index goes element by element; a
        # CPU decode step of 32 requests at 256 tokens costs 18 % less (benchmarks/results/
        # 2026-12-04-cpu-step-cost.txt)
        shape = (*locs.shape, *k_cache.shape[1:])
        flat = locs.reshape(-1)
        keys = k_cache.index_select(0, flat).view(shape)
        values = v_cache.index_select(0, flat).view(shape)
        max_k = locs.shape[1]
        mask = torch.arange(max_k, device=q.device).unsqueeze(0) < meta.cache_seqlens.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [B, H, 1, D]
            keys.transpose(1, 2),
            values.transpose(1, 2),  # [B, Hkv, max_k, D]
            attn_mask=mask[:, None, None, :],
            scale=self.scale,
            enable_gqa=True,
        )
        return out.squeeze(2)
