from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx

from .base import BaseOP


class VocabEmbedding(BaseOP):
    def __init__(
        self, vocab_size: int, hidden: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.weight = torch.empty(vocab_size, hidden, dtype=dtype, device=device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LMHead(BaseOP):
    """Projects hidden states to vocabulary logits. At prefill only each request's last position
    needs logits (the one that predicts the next token), so the others are dropped first: for a
    1000-token prompt that is 1000x less work in the largest matmul of the model.

    With tied embeddings the head owns no weight of its own (nothing in the state dict) and reads
    the
    embedding's weight instead."""

    def __init__(
        self,
        vocab_size: int,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
        tied_to: VocabEmbedding | None = None,
    ) -> None:
        self._tied_to = tied_to
        if tied_to is None:
            self.weight = torch.empty(vocab_size, hidden, dtype=dtype, device=device)

    @property
    def tied_to(self) -> VocabEmbedding | None:
        """The embedding whose weight this head reads, or None when it has its own."""
        return self._tied_to

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = get_global_ctx().batch
        if batch.is_prefill:  # each request's last row, or the rows a logprobs request asks for
            rows = batch.logit_rows
            x = x[batch.attn_metadata.last_indices if rows is None else rows]
        weight = self._tied_to.weight if self._tied_to is not None else self.weight
        return F.linear(x, weight)
