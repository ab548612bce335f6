"""Attention metadata in the FlashAttention "varlen" style.

A batch flattens all requests' new tokens into one sequence. To attend, each request needs to know
where its queries sit in that sequence and where its keys sit in the KV cache:

  cu_seqlens_q   [B+1]  prefix sums of the new-token counts: request i owns queries cu[i]:cu[i+1]
  cache_seqlens  [B]    total KV length of request i after this step (cached + new)
  page_table     [B, max_seqlen_k]  KV locations of request i's tokens (rows of the big page table)
  last_indices   [B]    index of each request's last query: where its next-token logits come from

Three optional fields serve a GPU (the reference backend works without them):

  rows                 [B]  each request's row in the engine's page table, on the device: a kernel
                            can read each request's own locations there, with no padded gather
  cu_seqlens_q_host    the same numbers as cu_seqlens_q / cache_seqlens, as Python lists: code that
  cache_seqlens_host   needs them on the CPU reads these instead of `.tolist()` on a device tensor,
                       which would wait for the GPU (and undo overlap scheduling)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import Batch


@dataclass
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor
    cache_seqlens: torch.Tensor
    page_table: torch.Tensor
    last_indices: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    rows: torch.Tensor | None = None
    cu_seqlens_q_host: List[int] | None = None
    cache_seqlens_host: List[int] | None = None


def prepare_metadata(
    batch: Batch, page_table: torch.Tensor, device: torch.device
) -> AttentionMetadata:
    """Build the attention metadata of `batch` from its requests' lengths.

    It is built before the step is launched, so the lengths are those before `complete_one`: a
    request's new tokens are its extend_len, and its keys after this step are its device_len.

    Receives: `batch`, its requests in order (each with `table_idx`, `cached_len`, `device_len`);
        `page_table`, the engine's whole page table [rows, max_seq_len] int32 on the device;
        `device`.
    Returns: an AttentionMetadata: `cu_seqlens_q` [B+1] int32 prefix sums of the new-token counts;
        `cache_seqlens` [B] int32 key lengths; `page_table` [B, max_seqlen_k], the requests' rows
        cut to the longest; `last_indices` [B] int64, each request's last query; `max_seqlen_q`,
        `max_seqlen_k` (ints); optionally `rows`, `cu_seqlens_q_host`, `cache_seqlens_host` for a
        GPU. All tensors on `device`.
    Leaves: nothing changed (a pure function).
    Uses: `req.extend_len` (ch01), `AttentionMetadata` (ch05); only torch otherwise.
    Checked: the fields of a mixed prefill batch and of a decode batch, on the right device;
        attention driven by this metadata equals dense causal attention, prefill and decode.
    """
    seqlens_q = [req.extend_len for req in batch.reqs]
    seqlens_k = [req.device_len for req in batch.reqs]
    cu = [0]
    for n in seqlens_q:
        cu.append(cu[-1] + n)
    cu_seqlens_q = torch.tensor(cu, dtype=torch.int32)
    max_k = max(seqlens_k)
    rows = torch.tensor([req.table_idx for req in batch.reqs], dtype=torch.int64)
    pin = device.type == "cuda"

    def to_dev(t: torch.Tensor) -> torch.Tensor:
        return (t.pin_memory() if pin else t).to(device, non_blocking=True)

    rows_dev = to_dev(rows)
    return AttentionMetadata(
        cu_seqlens_q=to_dev(cu_seqlens_q),
        cache_seqlens=to_dev(torch.tensor(seqlens_k, dtype=torch.int32)),
        page_table=page_table[rows_dev, :max_k],
        last_indices=to_dev((cu_seqlens_q[1:] - 1).to(torch.int64)),
        max_seqlen_q=max(seqlens_q),
        max_seqlen_k=max_k,
        rows=rows_dev,
        cu_seqlens_q_host=cu,
        cache_seqlens_host=seqlens_k,
    )
