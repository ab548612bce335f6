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

from typing import List

import torch

from minisgl.core import Req
from minisgl.engine.fused_graphs import capture_sizes, forward_rows, scratch_everywhere
from minisgl.engine.graph import graph_batch_sizes


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
        # the catch-up's inputs, written by one copy per proposal: token ids, positions and page-
        # table rows of 2 * B rows, as one int64 block [3, 2B] (flattened, the first 6B entries)
        self.staged = torch.zeros(3 * 2 * max_reqs, dtype=torch.int64, device=engine.device)
        self.host = engine.kit.pin(torch.zeros(3 * 2 * max_reqs, dtype=torch.int64))
        self.dummy_row = engine.dummy_row
        scratch_everywhere(engine)
        self.scratch_loc = int(engine.page_table[self.dummy_row, 0])
        # Per proposal, one int64 block copied in: the catch-up's token ids, positions and page-
        # table rows [3, 2B], then the page-table entries of the positions this proposal writes
        # (rows, columns, locations [3, (k + 1) B]: a catch-up of at most two and k - 1 steps)
        self.width = 6 + 3 * (k + 1)
        self.staged = torch.zeros(self.width * max_reqs, dtype=torch.int64, device=engine.device)
        self.host = engine.kit.pin(torch.zeros(self.width * max_reqs, dtype=torch.int64))
        self.graphs = capture_sizes(engine, self.sizes, self._proposal, before=self._pad)
        # the drafts' host copy (`copy_to_host`), and an event after it on a GPU
        self.drafts_host = engine.kit.pin(torch.zeros((max_reqs, k), dtype=torch.int32))
        self.copied = torch.cuda.Event() if engine.device.type == "cuda" else None
        self.replays = 0

    def fits(self, n: int) -> bool:
        return n <= self.max_reqs

    def _proposal(self, bs: int) -> torch.Tensor:
        """The captured work for `bs` requests: [bs, k] int32 drafts."""
        block = self.staged[: self.width * bs]
        writes = block[6 * bs :].view(3, -1)
        table = self.engine.page_table
        table.index_put_((writes[0], writes[1]), writes[2].to(torch.int32))
        staged = block[: 6 * bs].view(3, 2 * bs)
        ids, positions, rows = staged[0].to(torch.int32), staged[1], staged[2]
        logits = forward_rows(self.engine, ids, positions, rows)
        token = logits[1::2].argmax(dim=-1).to(torch.int32)  # each request's second row
        drafts = [token]
        # contiguous: the attention kernels read rows by pointer (triton_launch.check_vectors)
        position, row = positions[1::2], rows[1::2].contiguous()
        for _ in range(1, self.k):
            position = position + 1
            token = forward_rows(self.engine, token, position, row).argmax(dim=-1)
            token = token.to(torch.int32)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def _stage(self, size: int, ids, positions, rows, writes) -> None:
        """Copy a proposal's block for the graph of `size` in (padding: dummy rows, whose table
        writes map the scratch row to the scratch location, as it already is)."""
        catch = [[0] * (2 * size), [0] * (2 * size), [self.dummy_row] * (2 * size)]
        # a request with one token to catch up leaves its first row a dummy
        for i, (t, p, r) in enumerate(zip(ids, positions, rows)):
            at = slice(2 * i + 2 - len(t), 2 * i + 2)
            catch[0][at], catch[1][at], catch[2][at] = t, p, [r] * len(t)
        pad = (self.k + 1) * size - len(writes[0])
        table = [
            writes[0] + [self.dummy_row] * pad,
            writes[1] + [0] * pad,
            writes[2] + [self.scratch_loc] * pad,
        ]
        n = self.width * size
        flat = [x for part in catch + table for x in part]
        self.host[:n].copy_(torch.tensor(flat, dtype=torch.int64))
        self.staged[:n].copy_(self.host[:n], non_blocking=True)

    def _pad(self, size: int) -> None:
        self._stage(size, [], [], [], ([], [], []))

    def fits_writes(self, n_reqs: int, n_writes: int) -> bool:
        return n_writes <= (self.k + 1) * next(s for s in self.sizes if s >= n_reqs)

    def copy_to_host(self, drafts: torch.Tensor) -> torch.Tensor:
        """Start copying `drafts` (run's output) to page-locked host memory, on the current
        stream; the host tensor, valid once `host_copied` returned (reused by the next call)."""
        host = self.drafts_host[: drafts.shape[0]]
        host.copy_(drafts, non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        return host

    def host_copied(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()

    @torch.inference_mode()
    def run(self, ids: List[List[int]], positions: List[List[int]], rows: List[int], writes):
        """Replay the proposal of len(rows) requests; their drafts [B, k] int32 on the device (a
        view of the graph's output: read it before the next run).

        Receives: per request, `ids` and `positions`, its one or two catch-up tokens and their
            positions (the last one is the request's last token), and `rows`, its page-table row;
            `writes`, (rows, columns, locations) lists: the page-table entries the graph writes
            before it runs (`fits_writes`), which with those already there map every position up
            to each request's last + k - 1.
        """
        bs = len(rows)
        size = next(s for s in self.sizes if s >= bs)
        self._stage(size, ids, positions, rows, writes)
        graph, out = self.graphs[size]
        graph.replay()
        self.replays += 1
        return out if bs == size else out[:bs]


class FusedProposals:
    """What DraftModelDrafter (draft_model.py) does with its ProposalGraphs (`self.proposal`):
    a proposal as one replay, its drafts left on the device, their host copy read later."""

    @torch.inference_mode()
    def propose_on_device(self, reqs: List[Req], k: int) -> torch.Tensor | None:
        """k greedy draft tokens for every request, [len(reqs), k] int32 left on the device (a
        view of the proposal graph's output: read it before the next proposal), from one replay
        of the proposal graph; None where that does not apply (`propose` then serves). What the
        drafts are reaches the host later, when the next call needs it (`_settle`)."""
        prepared = self._prepare(reqs, k)
        if prepared is None:
            return None
        work, entries = prepared
        drafts = self._propose_fused(work, entries, k) if len(work) == len(reqs) else None
        if drafts is None:
            # nothing written: the `propose` that serves instead maps the same positions again
            self._table_writes = None
            return None
        self._unsettled = (work, entries, self.proposal.copy_to_host(drafts))
        return drafts

    def _settle(self) -> None:
        """Record the drafts `propose_on_device` left on the device: which tokens each entry's KV
        holds (its own and every draft but the last)."""
        if self._unsettled is None:
            return
        work, entries, host = self._unsettled
        self._unsettled = None
        self.proposal.host_copied()
        self._record([None] * (max(i for i, _, _ in work) + 1), work, entries, host.tolist())

    def _propose_fused(self, work, entries, k: int):
        """The drafts [len(work), k] from one replay of the proposal graph (draft_graph.py), or
        None where it does not apply: no graph for this k, more requests than it holds, a request
        drafting fewer than k tokens or lacking more than two tokens' KV."""
        graphs = self.proposal
        if graphs is None or graphs.k != k or not graphs.fits(len(work)):
            return None
        lacking = [len(t) - len(e.tokens) for e, (_, t, _) in zip(entries, work)]
        if any(b != k for _, _, b in work) or any(n > 2 for n in lacking):
            return None
        writes = self._table_writes
        if not graphs.fits_writes(len(work), len(writes[0])):
            return None
        self._table_writes = None
        ids = [t[len(t) - n :] for n, (_, t, _) in zip(lacking, work)]
        positions = [list(range(len(t) - n, len(t))) for n, (_, t, _) in zip(lacking, work)]
        return graphs.run(ids, positions, [e.row for e in entries], writes)
