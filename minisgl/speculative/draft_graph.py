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
        self.staged.view(3, -1)[2].fill_(self.dummy_row)  # dummy rows until the first run
        self.graphs = capture_sizes(engine, self.sizes, self._proposal)
        self.replays = 0

    def fits(self, n: int) -> bool:
        return n <= self.max_reqs

    def _proposal(self, bs: int) -> torch.Tensor:
        """The captured work for `bs` requests: [bs, k] int32 drafts."""
        staged = self.staged[: 6 * bs].view(3, 2 * bs)
        ids, positions, rows = staged[0].to(torch.int32), staged[1], staged[2]
        logits = forward_rows(self.engine, ids, positions, rows)
        token = logits[1::2].argmax(dim=-1).to(torch.int32)  # each request's second row
        drafts = [token]
        position, row = positions[1::2], rows[1::2]
        for _ in range(1, self.k):
            position = position + 1
            token = forward_rows(self.engine, token, position, row).argmax(dim=-1)
            token = token.to(torch.int32)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

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
