"""A draft model's whole proposal as one CUDA graph replay (issue 47).

A verify cycle of speculative decoding asks the draft model for k tokens per request: a catch-up
forward over the tokens accepted since its last proposal, then k - 1 greedy decode steps, each
fed the argmax of the step before. Run one forward at a time, each step pays the host's work
(metadata, copies, a replay, an argmax) and, on a model as small as a draft, that host work is
nearly all of what the step costs. Here the k forwards, the argmaxes between them and the
advance of positions, key lengths and KV locations are captured in one graph per batch size, so a
proposal is one host-to-device copy, one replay and the drafts left on the device.

The catch-up has a fixed shape in the graph: two rows per request, its last two tokens. That is
what a steady state needs: the draft ran every draft token but its last, so after a verify step
the tokens it lacks are the last draft token and the target's own (all k accepted), or the
target's correction alone (one rejected): two or one. With one, the request's first row is a
dummy (token 0 at position 0 of the scratch row, whose only location is the scratch one: the
padding rows of graph.py). A request that lacks more (its prompt, a history that changed) goes
through the drafter's step-by-step path.

Rows: catch-up row 2i + 1 is request i's last token; its argmax is draft 0. Step j (1..k-1) runs
one row per request at the position after step j - 1's, its KV location read from the page table
there (the drafter allocated every position up to the last draft's before the replay).
"""

from __future__ import annotations

import gc
from typing import Dict, List, Tuple

import torch

from minisgl.attention import AttentionMetadata
from minisgl.core import Batch
from minisgl.engine.graph import graph_batch_sizes
from minisgl.engine.graph_emulation import EmulatedGraph, capture


class ProposalGraphs:
    """One graph per batch size (1, 2, 4, ... up to `max_reqs`) of an engine's model: the
    catch-up of two rows per request, then `k - 1` greedy steps. `run(ids, positions, rows)`
    replays the graph of the smallest size that holds the requests and returns their drafts."""

    def __init__(self, engine, k: int, max_reqs: int) -> None:
        if k < 1 or max_reqs < 1:
            raise ValueError(
                f"a proposal graph needs k >= 1 and max_reqs >= 1, got {k}, {max_reqs}"
            )
        self.engine, self.k = engine, k
        self.sizes = graph_batch_sizes(max_reqs)
        self.max_reqs = max_reqs
        self.is_cuda = engine.device.type == "cuda"
        self.reads_rows = engine.backend_name == "triton"
        dev, table = engine.device, engine.page_table
        # the catch-up's inputs, written by one copy per proposal: token ids, positions and page-
        # table rows of 2 * B rows, as one int64 block [3, 2B] (flattened, the first 6B entries)
        self.staged = torch.zeros(3 * 2 * max_reqs, dtype=torch.int64, device=dev)
        self.host = engine.kit.pin(torch.zeros(3 * 2 * max_reqs, dtype=torch.int64))
        self.dummy_row = engine.dummy_row
        # a padding request's k - 1 steps run at positions 1..k-1 of the scratch row: every one of
        # them must map to the scratch location (graph.py set position 0's), or its KV would land
        # on location 0, a real request's
        table[self.dummy_row].fill_(table[self.dummy_row, 0].item())
        self.graphs: Dict[int, Tuple[object, torch.Tensor]] = {}
        self.replays = 0
        with torch.inference_mode():
            gc.collect()
            gc.disable()  # as GraphRunner: no collection may free CUDA objects mid-capture
            try:
                self._capture_all(table)
            finally:
                gc.enable()

    def fits(self, n: int) -> bool:
        return n <= self.max_reqs

    def _forward(self, ids, positions, rows, table) -> torch.Tensor:
        """Logits of one decode step of len(ids) rows (decode_rows.py's form), built from device
        tensors only, so that a capture records it whole."""
        n = ids.shape[0]
        dev = ids.device
        meta = AttentionMetadata(
            cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32, device=dev),
            cache_seqlens=(positions + 1).to(torch.int32),
            page_table=table,
            last_indices=torch.arange(n, dtype=torch.int64, device=dev),
            max_seqlen_q=1,
            max_seqlen_k=table.shape[1],
            rows=rows,
        )
        batch = Batch(reqs=[None] * n, phase="decode")
        batch.input_ids, batch.positions = ids, positions
        batch.out_loc = table[rows, positions].to(torch.int64)
        batch.attn_metadata = meta
        with self.engine.ctx.forward_batch(batch):
            if not self.reads_rows:  # the torch backend reads the requests' rows gathered
                meta.page_table = table.index_select(0, rows)
            return self.engine.model.forward()

    def _proposal(self, bs: int, table) -> torch.Tensor:
        """The captured work for `bs` requests: [bs, k] int32 drafts."""
        staged = self.staged[: 6 * bs].view(3, 2 * bs)
        ids, positions, rows = staged[0].to(torch.int32), staged[1], staged[2]
        logits = self._forward(ids, positions, rows, table)
        token = logits[1::2].argmax(dim=-1).to(torch.int32)  # each request's second row
        drafts = [token]
        position, row = positions[1::2], rows[1::2]
        for _ in range(1, self.k):
            position = position + 1
            token = self._forward(token, position, row, table).argmax(dim=-1).to(torch.int32)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def _capture_all(self, table) -> None:
        stream = self.engine.stream
        if self.is_cuda:
            torch.cuda.synchronize()
        # before any capture: dummy rows everywhere (token 0, position 0, the scratch row)
        self.staged.view(3, -1)[2].fill_(self.dummy_row)
        pool = None
        for bs in reversed(self.sizes):
            with stream.context():
                self._proposal(bs, table)  # warm-up: kernels compiled, workspaces settled
            stream.synchronize()
            if self.is_cuda:
                graph = torch.cuda.CUDAGraph()
                ctx = torch.cuda.graph(graph, pool=pool, stream=stream.raw)
            else:
                graph = EmulatedGraph()
                ctx = capture(graph, pool)
            with ctx:
                out = self._proposal(bs, table)
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = (graph, out)
        stream.synchronize()

    @torch.inference_mode()
    def run(self, ids: List[List[int]], positions: List[List[int]], rows: List[int]):
        """Replay the proposal of len(rows) requests; their drafts [B, k] int32 on the device (a
        view of the graph's output: read it before the next run).

        Receives: per request, `ids` and `positions`, its one or two catch-up tokens and their
            positions (the last one is the request's last token), and `rows`, its page-table row;
            every position up to its last + k - 1 allocated in the page table.
        """
        bs = len(rows)
        size = next(s for s in self.sizes if s >= bs)
        # dummy rows first: a request with one token to catch up leaves its first row one
        block = [[0] * (2 * size), [0] * (2 * size), [self.dummy_row] * (2 * size)]
        for i, (t, p, r) in enumerate(zip(ids, positions, rows)):
            at = slice(2 * i + 2 - len(t), 2 * i + 2)
            block[0][at], block[1][at], block[2][at] = t, p, [r] * len(t)
        self.host[: 6 * size].copy_(torch.tensor(block, dtype=torch.int64).view(-1))
        self.staged[: 6 * size].copy_(self.host[: 6 * size], non_blocking=True)
        graph, out = self.graphs[size]
        graph.replay()
        self.replays += 1
        return out[:bs]
