"""Several new tokens per request, run as a decode step of one row per token.

A verify step of speculative decoding scores each request's last token and its draft; a draft
model catches up on the tokens accepted since its last step. Both are extends of a few tokens per
request, and both can be run as a *decode* step instead, one row per token: row (i, j) is token
j of request i's run, at position start_i + j, with the KV location the page table gives that
position, request i's page-table row, and start_i + j + 1 keys. Every layer stores the K/V of
all rows before its attention reads the cache, so row j sees rows 0..j of its own request and
nothing later: the extend's causal mask comes from the key lengths alone. The decode LM head
keeps every row, so each row's logits come out, in row order.

Why bother: a decode step is what CUDA graphs replay (graph.py), so the few hundred launches of
such a step become one; and each row is scored by the decode attention kernel, the one a plain
decode step scores that position with (the prefill kernel sums in another order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from minisgl.attention import prepare_metadata
from minisgl.core import Batch


@dataclass(eq=False)
class DecodeRow:
    """One row: a request's token at `cached_len` (its position), in the form
    `prepare_metadata` reads a request (lengths before the step)."""

    table_idx: int
    cached_len: int
    is_chunk = False

    @property
    def device_len(self) -> int:
        return self.cached_len + 1

    @property
    def extend_len(self) -> int:
        return 1


def decode_rows(
    spans: Sequence[Tuple[int, int, int]], page_table: torch.Tensor, device: torch.device
) -> Batch:
    """A decode Batch of one row per position of each span, in span order then position order.

    Receives: `spans`, one (table_idx, start, end) per request: it runs positions start..end-1
        (end > start) of page-table row table_idx, whose KV locations are already allocated;
        `page_table` [rows, max_seq_len] int32, the engine's; `device`.
    Returns: a Batch of phase "decode" whose `reqs` are DecodeRows, with `positions`, `out_loc`
        (int64, each row's location from the page table) and `attn_metadata` filled in; its
        `input_ids` are left for the caller (the token of each row, in the same order).
    """
    rows: List[DecodeRow] = []
    for table_idx, start, end in spans:
        if end <= start:
            raise ValueError(f"span ({table_idx}, {start}, {end}) runs no position")
        rows.extend(DecodeRow(table_idx, p) for p in range(start, end))
    pin = device.type == "cuda"

    def to_dev(values: List[int]) -> torch.Tensor:
        t = torch.tensor(values, dtype=torch.int64)
        return (t.pin_memory() if pin else t).to(device, non_blocking=True)

    batch = Batch(reqs=rows, phase="decode")
    batch.positions = to_dev([r.cached_len for r in rows])
    table_rows = to_dev([r.table_idx for r in rows])
    batch.out_loc = page_table[table_rows, batch.positions].to(torch.int64)
    batch.attn_metadata = prepare_metadata(batch, page_table, device)
    return batch
