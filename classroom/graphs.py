"""Chapter 18's try-outs: decode batches made by hand on an engine that captured (emulated) CUDA
graphs, and the same batch run eagerly, so a replay can be compared with what it stands for."""

from __future__ import annotations

from typing import Sequence

import torch

from minisgl.attention import AttentionMetadata
from minisgl.core import Batch


def decode_batch(engine, rows: Sequence[int], lens: Sequence[int], seed: int) -> Batch:
    """A decode batch on `engine`: request i owns table row rows[i], holds lens[i] keys at
    locations rows[i] * 64 + 0..lens[i]-1, and computes a random token at position lens[i] - 1."""
    dev, g = engine.device, torch.Generator().manual_seed(seed)
    for r, n in zip(rows, lens):
        engine.page_table[r, :n] = torch.arange(n, dtype=torch.int32, device=dev) + r * 64
    n = len(rows)
    rows_t = torch.tensor(list(rows), dtype=torch.int64, device=dev)
    batch = Batch(reqs=[None] * n, phase="decode")
    batch.input_ids = torch.randint(0, 300, (n,), generator=g, dtype=torch.int32).to(dev)
    batch.positions = torch.tensor([x - 1 for x in lens], dtype=torch.int64, device=dev)
    batch.out_loc = torch.tensor([r * 64 + x - 1 for r, x in zip(rows, lens)], device=dev)
    batch.attn_metadata = AttentionMetadata(
        cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32, device=dev),
        cache_seqlens=torch.tensor(list(lens), dtype=torch.int32, device=dev),
        page_table=engine.page_table[rows_t, : max(lens)],
        last_indices=torch.arange(n, device=dev),
        max_seqlen_q=1,
        max_seqlen_k=max(lens),
        rows=rows_t,
        cu_seqlens_q_host=list(range(n + 1)),
        cache_seqlens_host=list(lens),
    )
    return batch


def last_location(rows: Sequence[int], lens: Sequence[int], i: int) -> int:
    """Where request i of `decode_batch(engine, rows, lens, ...)` writes its KV."""
    return rows[i] * 64 + lens[i] - 1


@torch.inference_mode()
def eager_logits(engine, batch: Batch) -> torch.Tensor:
    """The batch's logits from the model run eagerly, no graph."""
    with engine.ctx.forward_batch(batch):
        return engine.model.forward().clone()
