"""The step's bitmask applied to logits, on whatever device the logits are, and the sampling of a
batch whose constrained requests draw only what their grammars allow."""

from __future__ import annotations

import torch

from minisgl.engine.sampler import BatchSamplingArgs, Sampler


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


def sample_with_bitmask(
    sampler: Sampler,
    logits: torch.Tensor,
    args: BatchSamplingArgs,
    rows: torch.Tensor,
    bitmask: torch.Tensor,
) -> torch.Tensor:
    """Sample the batch, each constrained request only among its allowed tokens.

    The mask comes first, on the raw logits, and the sampler's whole rule runs after it: a greedy
    request takes the argmax over the allowed tokens, and temperature, top-k and top-p work on the
    allowed tokens alone, renormalized, so a draw can never land on a forbidden token, and a top-k
    whose k most likely tokens are all forbidden still draws among the allowed ones. A free request
    shares the batch: its row is not touched, so it draws what it would draw alone.

    Receives: `sampler`, the engine's sampler (ch06: `sample(logits, args)`); `logits` [R, V], one
        row per request, or, when a request asked for its prompt's logprobs, more rows than
        requests (`args.logprob_plan.sample_rows` [B] then names request i's row); `args` the
        batch's BatchSamplingArgs; `rows` [C] int64, the constrained requests' indexes in the batch;
        `bitmask` [C, W] int32, request rows[i]'s allowed tokens (bit j of word w: token 32 w + j),
        on the logits' device.
    Returns: next token ids [B], int32, as `sampler.sample` returns them.
    Leaves: the constrained requests' logits rows masked (in place is fine: nothing reads the
        logits after the step but the sampler, whose logprobs and seeded redraws then see the mask
        too); every other row unchanged.
    Uses: `apply_bitmask_` (above), `sampler.sample` (ch06).
    Checked: greedy constrained rows take the argmax over allowed tokens; sampled rows with top-k,
        top-p and temperature draw only allowed tokens, also when the k most likely are all
        forbidden; free rows keep their logits and their tokens; with prompt logprobs, the mask
        lands on the request's sampling row.
    """
    plan = args.logprob_plan  # prompt logprobs: more logits rows than requests
    at = rows if plan is None or plan.sample_rows is None else plan.sample_rows[rows]
    apply_bitmask_(logits, at, bitmask)
    return sampler.sample(logits, args)
