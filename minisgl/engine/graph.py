"""CUDA graphs for decode.

A decode step of a small model is hundreds of tiny kernels; launching them one by one from Python
costs more CPU time than the GPU needs to run them. A CUDA graph records the launches once and
replays them with one call. A graph replays fixed shapes and fixed addresses, so:

* one graph per batch size in `graph_batch_sizes` (1, 2, 4, ... up to the maximum); a batch of 5
  runs the graph of 8, padded with 3 dummy requests;
* the inputs live in static buffers, copied in before each replay; a dummy request reads and writes
  only the engine's scratch row and a scratch KV location nobody else uses;
* the attention kernel reads lengths from the device and has a fixed launch shape (Triton backend);
  the torch backend, which reads a gathered page table, gets it gathered inside the graph from the
  static `rows`, as wide as the context length.

Batches above the largest size, prefill batches, and metadata without `rows` run eagerly.

On a CPU the same runner captures `EmulatedGraph`s (graph_emulation.py): a replay re-runs only
the captured operators on the static buffers, so a buffer not refreshed before a replay gives
wrong tokens on a laptop as on a GPU.
"""

from __future__ import annotations

import gc
from typing import Dict, List, Tuple

import torch

from minisgl.attention import AttentionMetadata
from minisgl.core import Batch, Context
from minisgl.models import CausalLM
from minisgl.utils import Stream

from .graph_emulation import EmulatedGraph, capture


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
        stream: Stream,
        max_bs: int,
        dummy_row: int,
        scratch_loc: int,
        max_seq_len: int,
        page_table: torch.Tensor,
        reads_rows: bool = True,
    ) -> None:
        self.model, self.ctx, self.stream = model, ctx, stream
        # whether the attention backend finds each request's KV locations through `rows` (Triton)
        # or needs the page table's rows gathered for it (torch)
        self.reads_rows = reads_rows
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
        self.is_cuda = dev.type == "cuda"
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph | EmulatedGraph, torch.Tensor]] = {}
        self.captured: List[int] = []  # batch sizes in the order they were captured
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
            if not self.reads_rows:  # inside the graph: gathered again from `rows` at every replay
                meta = batch.attn_metadata
                meta.page_table = self._page_table.index_select(0, meta.rows)
            return self.model.forward()

    def _new_graph(self):
        return torch.cuda.CUDAGraph() if self.is_cuda else EmulatedGraph()

    def _capturing(self, graph, pool):
        if self.is_cuda:
            return torch.cuda.graph(graph, pool=pool, stream=self.stream.raw)
        return capture(graph, pool)

    def _synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize()
        else:
            self.stream.synchronize()

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
        self._synchronize()
        pool = None
        for bs in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory
            batch = self._static_batch(bs)
            with self.stream.context():
                self._run(batch)  # warm-up: compiles kernels, settles cuBLAS workspaces
            self.stream.synchronize()
            graph = self._new_graph()
            with self._capturing(graph, pool):
                logits = self._run(batch)
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = (graph, logits)
            self.captured.append(bs)
        self._synchronize()

    def graph_size(self, batch: Batch) -> int | None:
        """The captured batch size `batch` replays from, or None when it must run eagerly.

        A graph holds one decode step of a fixed batch size whose attention finds each request's
        KV through `rows`. A batch runs from the smallest captured size that holds it; the slots
        it leaves free are padded with dummy requests by `replay`.

        Receives: `batch`, a Batch about to run (its phase, its requests, `attn_metadata`, which
            may be None or have `rows` None).
        Returns: an int from `self.sizes`, the smallest one >= `batch.size`; None for a prefill
            batch, a batch larger than `self.max_bs`, or one without metadata or without `rows`.
        Leaves: nothing changed.
        Uses: `self.sizes` (rising), `self.max_bs`, `batch.is_decode`, `batch.size` (ch01).
        Checked: every size from 1 to max_bs + 1 gets the smallest size that holds it or None;
            prefill and row-less batches get None; the engine's prefill steps and oversized batches
            never replay, and greedy tokens through the graphs equal eager ones.
        """
        meta = batch.attn_metadata
        if not batch.is_decode or meta is None or meta.rows is None:
            return None
        if batch.size > self.max_bs:
            return None
        return next(s for s in self.sizes if s >= batch.size)

    # the static buffers are inference tensors: callers outside it may replay too
    @torch.inference_mode()
    def replay(self, batch: Batch, padded: int) -> torch.Tensor:
        """Run the decode `batch` through the graph captured for `padded` requests; its logits.

        A replay re-runs the captured work on the static buffers and nothing else: every input
        the step reads must be in them first. The first `batch.size` slots hold the batch's own
        inputs; the slots up to `padded` hold dummy requests (`self._dummy`: token 0, position 0,
        the scratch row and the scratch KV location, length 1), since an earlier, larger batch
        may have left a real request's values there, and a padding slot writes KV where its
        `out_loc` points.

        Receives: `batch`, a decode Batch with `input_ids`, `positions`, `out_loc` [B] and
            `attn_metadata` (`rows`, `cache_seqlens` [B]); `padded`, `graph_size(batch)`.
        Returns: the logits of the batch's requests, [B, vocab], a view of the graph's output.
        Leaves: the static buffers `input_ids`, `positions`, `out_loc`, `rows`, `seqlens` filled
            (slots 0..B-1 from the batch, B..padded-1 with the dummy's values); the graph of
            `padded` replayed once; `self.replays` one higher.
        Uses: `self.graphs[padded]` (the graph and its logits), `self._dummy`, the five static
            buffers, `Tensor.copy_` / `fill_`.
        Checked: logits equal eager logits after another batch left every buffer different;
            greedy tokens equal eager ones for batches of 1 to max_bs + 1; a padding slot writes
            only the scratch location; prefill steps never replay.
        """
        bs = batch.size
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

    @torch.inference_mode()
    def replay_next(self, input_ids: torch.Tensor, bs: int, padded: int) -> torch.Tensor:
        """The decode batch `replay` ran last, one token further: its logits.

        A draft model's greedy steps run the same requests again and again, each one position
        further, its input the token the step before chose. Rebuilding the batch on the host
        (metadata, copies) costs more host time than the replay; here the static buffers advance
        on the device instead: positions and key lengths + 1, each row's KV location read from
        the page table at its new position, the input ids copied in. The padding slots keep their
        dummy values.

        Receives: `input_ids` [bs] on the device; `bs` and `padded`, the size of the batch the
            last `replay` (or `replay_next`) of this runner ran and the graph it ran. Nothing else
            may have replayed since, and every row's next position must be allocated in the page
            table.
        Returns: the batch's logits [bs, vocab], a view of the graph's output.
        """
        self.input_ids[:bs].copy_(input_ids)
        self.positions[:bs].add_(1)
        self.seqlens[:bs].add_(1)
        self.out_loc[:bs].copy_(self._page_table[self.rows[:bs], self.positions[:bs]])
        graph, logits = self.graphs[padded]
        graph.replay()
        self.replays += 1
        return logits[:bs]
