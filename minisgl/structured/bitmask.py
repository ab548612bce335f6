"""The step's bitmask applied to logits, on whatever device the logits are (torch only)."""

from __future__ import annotations

import torch


def apply_bitmask_(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, every logit of `logits[rows[i]]` whose bit in `bitmask[i]` is clear.

    `bitmask` [C, W] int32: bit j of word w allows token 32 w + j. Columns past 32 W (a model whose
    logits are wider than its tokenizer's vocabulary) are forbidden. Other rows are untouched, so
    a free request's logits are the same with or without constrained neighbours."""
    vocab = logits.shape[-1]
    # made where the mask is (a kernel, not a copy from the host, which could wait for the stream)
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)  # [C, 32 W]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    allowed = allowed[:, :vocab]
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
