"""The ops of a tensor-parallel model: a rank holds a slice of each weight, and these ops put the
slices' partial results together.

Megatron's split, per decoder layer: the merged q|k|v and gate|up projections are *column*
parallel (each rank keeps whole heads, and whole rows of gate and of up: plain `Linear`s with
fewer rows, no communication), so each rank's attention and SiLU run on its own heads and columns
alone. o_proj and down_proj are *row* parallel: each rank multiplies its columns' inputs by its
columns of the weight, which gives a partial sum of the whole output; one all-reduce adds the
partial sums. Two all-reduces a layer, one more for the embedding, one all-gather for the logits.

Which slice of the checkpoint each rank reads is minisgl/models/sharding.py's job.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx
from minisgl.distributed import Collectives
from minisgl.kernel.dispatch import fused_for

from .embedding import LMHead, VocabEmbedding
from .linear import Linear


class RowParallelLinear(Linear):
    """y = all_reduce(x_r W_r^T) + b: `weight` is this rank's columns [out, in / ranks], `x` this
    rank's part of the input. The bias, whole on every rank, is added once, after the sum (added
    before it, it would count `ranks` times)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype, device, comm):
        super().__init__(in_features, out_features, bias, dtype, device)
        self._comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole layer's output from this rank's columns: every rank returns the same y.

        Receives: `x` [tokens, in / ranks], this rank's part of the input (the column-parallel
            layer before it left each rank its own part).
        Returns: [tokens, out], x W^T summed over the ranks, plus the bias if the layer has one:
            the same tensor on every rank.
        Leaves: nothing changed but the collectives' counts (one all-reduce).
        Uses: `local_product(x, self.weight)` (this rank's x_r W_r^T, no bias),
            `self._comm.all_reduce` (the sum over the ranks, in place), `self.bias` and
            `self._has_bias`.
        Checked: equals one whole nn.Linear on 2 and 4 ranks, with and without a bias and for
            one row; a bias added once, after the sum (added on every rank it counts `ranks`
            times); TP=2 greedy tokens equal transformers' on checkpoints with random biases.
        """
        y = self._comm.all_reduce(local_product(x, self.weight))
        return y + self.bias if self._has_bias else y


def local_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T for this rank's slices, without a bias: on a GPU a decode step of one request goes
    through the fused kernel for one row, as the one-rank Linear does."""
    fused = fused_for(x)
    if fused is not None and x.numel() == x.shape[-1]:
        return fused.small_batch_linear(x, weight)
    return F.linear(x, weight)


class VocabParallelEmbedding(VocabEmbedding):
    """Rank r keeps rows [start, start + rows) of the embedding (the vocabulary padded to a
    multiple of the ranks; padding rows are zero). A token another rank owns looks up a zero row
    here, so the all-reduce of every rank's lookup is the whole embedding."""

    def __init__(self, rows: int, hidden: int, dtype, device, comm: Collectives) -> None:
        super().__init__(rows, hidden, dtype, device)
        self._comm, self._start = comm, comm.rank * rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._comm.all_reduce(lookup_own_rows(ids, self.weight, self._start))


def lookup_own_rows(ids: torch.Tensor, weight: torch.Tensor, start: int) -> torch.Tensor:
    """This rank's part of the embedding of `ids`: its own rows, zeros for every other id.

    `weight` holds rows [start, start + len(weight)) of the vocabulary. An id in that range gets
    its row; any other id gets zeros, so that the sum over the ranks is the whole embedding.
    (Looking such an id up anyway would read another token's row, or past the end of `weight`.)

    Receives: `ids`, int64 token ids of any shape [...], each in the whole (padded) vocabulary;
        `weight` [rows, hidden], this rank's rows; `start`, the vocabulary id of `weight`'s row 0.
    Returns: [..., hidden] in `weight`'s dtype: the entry for an id is `weight[id - start]` if
        this rank owns the id, else zeros.
    Leaves: nothing changed (a pure function; `ids` is not modified).
    Uses: only torch: `F.embedding`, `torch.where`; a mask of the ids this rank owns.
    Checked: the ranks' lookups add up to the whole embedding on 2 and 4 ranks, with a vocabulary
        padded to a multiple of the ranks; an id another rank owns looks up zeros (the ids just
        outside the range too); the weight's dtype and the ids' shape kept; the ids left as they
        were; runs in every rank of a real group.
    """
    rows = weight.shape[0]
    local = ids - start
    mine = (local >= 0) & (local < rows)
    out = F.embedding(torch.where(mine, local, torch.zeros_like(local)), weight)
    return out * mine.unsqueeze(-1).to(out.dtype)


class ParallelLMHead(LMHead):
    """Each rank computes the logits of its rows of the vocabulary; the all-gather joins them along
    the vocabulary, in rank order, and the padding columns past the real vocabulary are cut off
    (mini-sglang #100: a vocabulary not divisible by the ranks)."""

    def __init__(self, rows, hidden, dtype, device, comm, vocab_size: int, tied_to=None) -> None:
        super().__init__(rows, hidden, dtype, device, tied_to=tied_to)
        self._comm, self._vocab_size = comm, vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = get_global_ctx().batch
        if batch.is_prefill:  # each request's last row, or the rows a logprobs request asks for
            rows = batch.logit_rows
            x = x[batch.attn_metadata.last_indices if rows is None else rows]
        weight = self._tied_to.weight if self._tied_to is not None else self.weight
        local = F.linear(x, weight)  # [B, rows]
        return self._comm.all_gather(local, dim=-1)[:, : self._vocab_size]
