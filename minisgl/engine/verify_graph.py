"""The greedy verify step with its acceptance on the device, as one graph replay (issue 47).

verify_step.py runs a verify step as decode rows replayed from graph.py's graphs, then gathers
the positions' logits, takes their argmax and applies `verify_greedy`, writes the accepted tokens
into the token pool and copies them to the host: a few dozen host operations around one replay,
each as costly as the replay itself on a small model. When every request of the step is greedy,
has no grammar and no logprobs, and drafted exactly k tokens that are already on the device (the
draft model's proposal graph left them there: minisgl/speculative/draft_graph.py), all of that is
captured here, per batch size, behind one copy in and one copy out:

* in: each request's page-table row and `base` (its device_len: its last token sits at base - 1,
  its draft j at base + j), one int64 block; and the drafts [B, k], copied on the device;
* the forward: request i's k + 1 rows at positions base - 1 .. base + k - 1 (decode_rows.py), the
  first row's token read from the token pool, the others the drafts;
* the acceptance, `verify_greedy`'s rule: the drafts kept while they equal the target's argmax,
  then the target's own token; every accepted token written into the token pool at its position;
* out: [B, k + 2] int64, the tokens (-1 past the count) and the count, one copy to the host.

A padding request (a batch of 3 in the graph of 4) runs on the scratch row at base 1, whose every
position maps to the scratch location (fused_graphs.scratch_everywhere); its token-pool writes go
to the scratch row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from .fused_graphs import capture_sizes, forward_rows, scratch_everywhere
from .graph import graph_batch_sizes
from .verify_step import VerifyInput, VerifyOutput


@dataclass
class FusedVerifyInput(VerifyInput):
    """A verify step `VerifyGraphs` runs whole: its plan's `draft` is [B, k] on the device, every
    request drafted k; its batch carries no positions, locations or metadata (the graph computes
    them), nor input and write tuples."""


class VerifyGraphs:
    """One graph per batch size (1, 2, 4, ... up to `max_reqs`) of the target engine: the greedy
    verify step of k drafts per request with its acceptance. `launch` queues one replay."""

    def __init__(self, engine, k: int, max_reqs: int) -> None:
        if k < 1 or max_reqs < 1:
            raise ValueError(f"a verify graph needs k >= 1 and max_reqs >= 1, got {k}, {max_reqs}")
        self.engine, self.k = engine, k
        self.sizes = graph_batch_sizes(max_reqs)
        self.max_reqs = max_reqs
        dev = engine.device
        # [2, B] flattened: page-table rows, then bases; padding requests: the scratch row, base 1
        self.staged = torch.ones(2 * max_reqs, dtype=torch.int64, device=dev)
        self.drafts = torch.zeros((max_reqs, k), dtype=torch.int32, device=dev)
        # page-locked, reused by every launch: a verify step is handled (its output read) before
        # the next one is prepared, since speculation runs the normal loop
        self.host = engine.kit.pin(torch.zeros(2 * max_reqs, dtype=torch.int64))
        self.out_host = engine.kit.pin(torch.zeros((max_reqs, k + 2), dtype=torch.int64))
        scratch_everywhere(engine)
        self.graphs = capture_sizes(engine, self.sizes, self._verify, before=self._pad)
        self.replays = 0

    def _pad(self, size: int) -> None:
        """Padding requests only, for the warm-up and the capture of `size`."""
        self.staged[:size].fill_(self.engine.dummy_row)
        self.staged[size : 2 * size].fill_(1)

    def fits(self, n: int) -> bool:
        return n <= self.max_reqs

    def _verify(self, bs: int) -> torch.Tensor:
        """The captured work for `bs` requests: [bs, k + 2] int64, tokens then count."""
        engine, k = self.engine, self.k
        staged = self.staged[: 2 * bs].view(2, bs)
        rows, bases = staged[0], staged[1]
        offsets = torch.arange(k + 1, dtype=torch.int64, device=rows.device)
        positions = (bases - 1).unsqueeze(1) + offsets  # [bs, k + 1]
        row_of = rows.unsqueeze(1).expand(bs, k + 1)
        drafts = self.drafts[:bs]
        last = engine.token_pool[rows, bases - 1].unsqueeze(1)
        ids = torch.cat([last, drafts], dim=1)
        logits = forward_rows(
            engine, ids.reshape(-1), positions.reshape(-1), row_of.reshape(-1).contiguous()
        )
        target = logits.view(bs, k + 1, -1).argmax(dim=-1)  # [bs, k + 1] int64
        agrees = drafts.to(torch.int64) == target[:, :k]
        count = agrees.to(torch.int64).cumprod(dim=1).sum(dim=1) + 1
        tokens = torch.where(offsets < count.unsqueeze(1), target, -1)
        # every accepted token into the token pool at its position (the next step reads the last);
        # past the count, the scratch row takes the write (no boolean mask: a fixed shape)
        keep = tokens >= 0
        write_rows = torch.where(keep, row_of, engine.dummy_row)
        write_cols = torch.where(keep, positions + 1, 0)
        engine.token_pool.index_put_((write_rows, write_cols), tokens.clamp_min(0).to(torch.int32))
        return torch.cat([tokens, count.unsqueeze(1)], dim=1)

    def launch(self, rows: List[int], bases: List[int], drafts: torch.Tensor):
        """Queue the verify step of len(rows) requests on the engine stream, without waiting; its
        VerifyOutput: tokens [B, k + 1] int64 (-1 past the count) and count [B] int64 on the
        host, valid once its `copy_done` has completed (no logprobs).

        Receives: each request's page-table row and base (its device_len: the KV of every
            position up to base + k - 1 allocated); `drafts` [B, k] on the device."""
        engine, bs = self.engine, len(rows)
        size = next(s for s in self.sizes if s >= bs)
        pad, n = size - bs, 2 * size
        block = rows + [engine.dummy_row] * pad + bases + [1] * pad
        self.host[:n].copy_(torch.tensor(block, dtype=torch.int64))
        out_host = self.out_host[:bs]
        graph, out = self.graphs[size]

        def work() -> None:
            self.staged[:n].copy_(self.host[:n], non_blocking=True)
            self.drafts[:bs].copy_(drafts)
            graph.replay()
            out_host.copy_(out if bs == size else out[:bs], non_blocking=True)

        engine.stream.launch(work)
        done = engine.kit.new_event()
        done.record(engine.stream)
        self.replays += 1
        return VerifyOutput(out_host[:, : self.k + 1], out_host[:, self.k + 1], done)
