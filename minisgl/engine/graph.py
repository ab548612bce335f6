"""CUDA graphs for decode.

A decode step of a small model is hundreds of tiny kernels; launching them one by one from Python
costs more CPU time than the GPU needs to run them. A CUDA graph records the launches once and
replays them with one call. A graph replays fixed shapes and fixed addresses, so:

* one graph per batch size in `graph_batch_sizes` (1, 2, 4, ... up to the maximum); a batch of 5
  runs the graph of 8, padded with 3 dummy requests;
* the inputs live in static buffers, copied in before each replay; a dummy request reads and writes
  only the engine's scratch row and a scratch KV location nobody else uses;
* the attention kernel reads lengths from the device and has a fixed launch shape (Triton backend).

Batches above the largest size, prefill batches, and metadata without `rows` run eagerly.
"""

from __future__ import annotations

import gc
from typing import Dict, List, Tuple

import torch

from minisgl.attention import AttentionMetadata
from minisgl.core import Batch, Context
from minisgl.models import CausalLM


def graph_batch_sizes(max_bs: int) -> List[int]:
    sizes, bs = [], 1
    while bs < max_bs:
        sizes.append(bs)
        bs *= 2
    sizes.append(max_bs)
    return sizes


class GraphRunner:
    def __init__(
        self,
        model: CausalLM,
        ctx: Context,
        stream: torch.cuda.Stream,
        max_bs: int,
        dummy_row: int,
        scratch_loc: int,
        max_seq_len: int,
        page_table: torch.Tensor,
    ) -> None:
        self.model, self.ctx, self.stream = model, ctx, stream
        self.sizes = graph_batch_sizes(max_bs)
        self.max_bs = max_bs
        dev = page_table.device
        # what a dummy request looks like: token 0 at position 0 of the scratch row, whose single
        # KV location is the scratch location
        self._dummy = dict(input_ids=0, positions=0, out_loc=scratch_loc, rows=dummy_row, seqlens=1)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_loc = torch.full((max_bs,), scratch_loc, dtype=torch.int64, device=dev)
        self.rows = torch.full((max_bs,), dummy_row, dtype=torch.int64, device=dev)
        self.seqlens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self._page_table = page_table
        self._max_seq_len = max_seq_len
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays = 0  # how many steps ran from a graph (tests check that graphs are used)
        self._capture_all()

    def _static_batch(self, bs: int) -> Batch:
        meta = AttentionMetadata(
            cu_seqlens_q=torch.arange(bs + 1, dtype=torch.int32, device=self.rows.device),
            cache_seqlens=self.seqlens[:bs],
            page_table=self._page_table,  # unused by the Triton decode path, which reads `rows`
            last_indices=torch.arange(bs, dtype=torch.int64, device=self.rows.device),
            max_seqlen_q=1,
            max_seqlen_k=self._max_seq_len,
            rows=self.rows[:bs],
        )
        batch = Batch(reqs=[None] * bs, phase="decode")  # the model reads only the tensors below
        batch.input_ids, batch.positions, batch.out_loc = (
            self.input_ids[:bs],
            self.positions[:bs],
            self.out_loc[:bs],
        )
        batch.attn_metadata = meta
        return batch

    def _run(self, batch: Batch) -> torch.Tensor:
        with self.ctx.forward_batch(batch):
            return self.model.forward()

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # No garbage collection while capturing: a collection could free an old engine's pinned
        # buffers or events mid-capture, and CUDA calls that are illegal in a capture invalidate it.
        gc.collect()
        gc.disable()
        try:
            self._capture_sizes()
        finally:
            gc.enable()

    def _capture_sizes(self) -> None:
        torch.cuda.synchronize()
        pool = None
        for bs in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory
            batch = self._static_batch(bs)
            with torch.cuda.stream(self.stream):
                self._run(batch)  # warm-up: compiles kernels, settles cuBLAS workspaces
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                logits = self._run(batch)
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = (graph, logits)
        torch.cuda.synchronize()

    def can_run(self, batch: Batch) -> bool:
        meta = batch.attn_metadata
        return (
            batch.is_decode
            and batch.size <= self.max_bs
            and meta is not None
            and meta.rows is not None
        )

    def padded_size(self, bs: int) -> int:
        return next(s for s in self.sizes if s >= bs)

    # the static buffers are inference tensors: callers outside it may replay too
    @torch.inference_mode()
    def replay(self, batch: Batch) -> torch.Tensor:
        """Run `batch` (decode, input_ids already gathered) through its graph; logits [bs, vocab].
        Call on the engine stream."""
        bs = batch.size
        padded = self.padded_size(bs)
        meta = batch.attn_metadata
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        self.rows[:bs].copy_(meta.rows)
        self.seqlens[:bs].copy_(meta.cache_seqlens)
        if padded > bs:  # a larger batch may have left real requests in the padding slots
            for name, value in self._dummy.items():
                getattr(self, name)[bs:padded].fill_(value)
        graph, logits = self.graphs[padded]
        graph.replay()
        self.replays += 1
        return logits[:bs]
