"""Driving an engine by hand, without a scheduler (chapter 6).

Chapter 6 runs `Engine.forward_batch` before there is a scheduler, so something has to build a
step's `ForwardInput`. `prepare` does it for requests whose page-table rows already hold fixed KV
locations (chapter 6's `small_engine`): no cache manager, no chunks. It lives here rather than in
the chapter because it is most of chapter 7's `_prepare_batch`, an exercise: reading it first
would give that exercise away.
"""

from __future__ import annotations

from typing import List

import torch

from minisgl.attention import prepare_metadata
from minisgl.core import Batch, Req
from minisgl.engine import BatchSamplingArgs, Engine, ForwardInput


def prepare(engine: Engine, reqs: List[Req], phase: str) -> ForwardInput:
    """The ForwardInput of one step of `reqs` ("prefill" or "decode"), their lengths not yet
    advanced: each request processes its positions cached_len .. device_len - 1."""
    batch = Batch(reqs, phase)
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
    cols = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.positions = cols
    batch.out_loc = engine.page_table[rows, cols].to(torch.int64)
    batch.attn_metadata = prepare_metadata(batch, engine.page_table, engine.device)
    vocab = engine.model_config.vocab_size
    args = BatchSamplingArgs.from_params([r.sampling_params for r in reqs], vocab, engine.device)
    write = (torch.tensor([r.table_idx for r in reqs]), torch.tensor([r.device_len for r in reqs]))
    return ForwardInput(batch, args, (rows, cols), write)
