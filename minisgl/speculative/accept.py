"""Which draft tokens a verify step keeps, and the token it adds after them.

The target model has scored the request's last token and its k draft tokens in one forward, so it
has a next-token distribution p_j at each of the k + 1 positions: p_0 follows the last accepted
token, p_j follows draft token j - 1. Both rules below walk the draft in order, keep a prefix of
it, and always add one token of the target's own after that prefix (the correction where a draft
token was turned down, the "bonus" token where every one was kept): a verify step never yields
fewer tokens than a plain decode step.

Rows are requests; every rule is applied to all rows at once (the batch's tensors stay on their
device: the only host work is a Python loop over the k positions, never over the rows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["check_verify_inputs", "verify_greedy", "verify_sampled"]


def check_verify_inputs(
    draft: Tensor, draft_len: Tensor, target: Tensor, draft_probs: Tensor | None = None
) -> None:
    """Raise a ValueError naming what is wrong with a verify step's inputs: `draft` [B, k] and
    `draft_len` [B] int64 with 0 <= draft_len <= k, `target` (the target's argmax [B, k + 1] or
    its probabilities [B, k + 1, V]) and, where given, `draft_probs` [B, k, V] like the target's."""
    if draft.dim() != 2 or draft.dtype != torch.int64:
        raise ValueError(f"draft must be [B, k] int64, got {tuple(draft.shape)} {draft.dtype}")
    batch, k = draft.shape
    if tuple(draft_len.shape) != (batch,) or draft_len.dtype != torch.int64:
        raise ValueError(
            f"draft_len must be [B] = [{batch}] int64, got {tuple(draft_len.shape)} "
            f"{draft_len.dtype}"
        )
    if tuple(target.shape[:2]) != (batch, k + 1):
        raise ValueError(
            f"the target must have B = {batch} rows of k + 1 = {k + 1} positions (the last "
            f"token and each draft token), got {tuple(target.shape)}"
        )
    bad = ((draft_len < 0) | (draft_len > k)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"draft_len must be within 0..k = {k}: row {bad[0]} has {int(draft_len[bad[0]])}"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (batch, k, target.shape[-1]):
        raise ValueError(
            f"draft_probs must be [B, k, V] = [{batch}, {k}, {target.shape[-1]}], got "
            f"{tuple(draft_probs.shape)}"
        )


def verify_greedy(draft: Tensor, draft_len: Tensor, target_argmax: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy verification: keep the draft while it agrees with the target's argmax.

    A greedy target would have produced target_argmax[i, 0] next, then, only if that equals
    draft[i, 0], target_argmax[i, 1], and so on: the draft is kept up to its first disagreement,
    and the target's token at that position comes after it. So the output is exactly what the
    target alone would have produced, one forward for several tokens.

    Receives: `draft` [B, k] int64, the proposed tokens; entries at or past `draft_len[i]` are
        padding, any value, and never kept even where they equal the target's; `draft_len` [B]
        int64 in 0..k; `target_argmax` [B, k + 1] int64, the target's argmax at each position
        (position j follows draft token j - 1; position 0 the request's last token).
    Returns: (tokens [B, k + 1] int64, count [B] int64): row i keeps the longest prefix n <=
        draft_len[i] of its draft equal to target_argmax[i, :n], then target_argmax[i, n] (the
        correction, or the bonus token when all draft_len[i] were kept); count = n + 1 and
        tokens[i, count:] = -1.
    Leaves: every input as it was.
    Uses: torch; `check_verify_inputs` for the shapes and the range of draft_len.
    Checked: the longest agreeing prefix and the correction after it; all kept gives the bonus
        token; padding never kept, even when it equals the target's token; draft_len 0 gives the
        target's token alone; -1 after the count; bad shapes or draft_len a ValueError.
    """
    check_verify_inputs(draft, draft_len, target_argmax)
    k = draft.shape[1]
    positions = torch.arange(k + 1, device=draft.device)
    agrees = (draft == target_argmax[:, :k]) & (positions[:k] < draft_len[:, None])
    kept = agrees.long().cumprod(dim=1).sum(dim=1)  # the agreeing prefix stops at the first False
    count = kept + 1
    # the kept draft tokens equal the target's, so the target's row is the answer up to count
    tokens = torch.where(positions < count[:, None], target_argmax, -1)
    return tokens, count


def verify_sampled(
    draft: Tensor,
    draft_len: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): the output follows the
    target's distribution exactly, whatever the draft proposed.

    Row i, position j = 0, 1, ...: draft token x = draft[i, j] is kept with probability
    min(1, p_j(x) / q_j(x)); at the first one turned down, the replacement is drawn from
    normalize(max(p_j - q_j, 0)) and the row stops; if all draft_len[i] tokens were kept, a bonus
    token is drawn from p at position draft_len[i]. The chapter shows why the residual
    max(p - q, 0) is the one replacement distribution that makes every emitted token p-distributed.

    Receives: `draft`, `draft_len` as `verify_greedy`; `draft_probs` [B, k, V] float32, the
        drafter's distribution q_j at each draft position, or None for a deterministic drafter
        (q_j one-hot at the drafted token: prompt lookup, a greedy draft model);
        `target_probs` [B, k + 1, V] float32, the target's distribution p_j at each position
        after temperature, top-k and top-p (each row sums to 1; a greedy row is one-hot, which
        makes this verify_greedy); `generator`, where every random number is drawn (None:
        torch's default generator).
    Returns: what `verify_greedy` returns.
    Leaves: every input as it was.
    Uses: torch (`torch.rand`, `torch.multinomial` with `generator`); `check_verify_inputs`.
    Checked: over many draws, the first token and the pair (first token, count) follow the
        target's distribution, for an adversarial draft, a draft equal to the target, a draft
        sure of an unlikely token, and draft_probs None; one-hot targets give verify_greedy's
        answer; padding never kept; the same generator state gives the same result; bad shapes
        or draft_len a ValueError.
    """
    check_verify_inputs(draft, draft_len, target_probs, draft_probs)
    batch, k = draft.shape
    rows = torch.arange(batch, device=draft.device)
    positions = torch.arange(k + 1, device=draft.device)
    in_draft = positions[:k] < draft_len[:, None]
    drafted = torch.where(in_draft, draft, 0)  # padding may be any value: never index with it
    p = target_probs[:, :k].gather(2, drafted[..., None]).squeeze(2)  # [B, k]: p_j(x_j)
    if draft_probs is None:
        q = torch.ones_like(p)
    else:
        q = draft_probs.gather(2, drafted[..., None]).squeeze(2)
    # kept with probability min(1, p / q): u < p / q, written without dividing by q
    u = torch.rand(p.shape, generator=generator, device=p.device)
    kept_each = (u * q < p) & in_draft
    kept = kept_each.long().cumprod(dim=1).sum(dim=1)  # [B]: the row stops at its first refusal

    # the token after the kept prefix: from the residual where a draft token was turned down,
    # from p itself (the bonus) where the whole draft was kept
    p_next = target_probs[rows, kept]  # [B, V]
    refused = (kept < draft_len)[:, None]
    if draft_probs is None:
        q_next = F.one_hot(F.pad(drafted, (0, 1))[rows, kept], target_probs.shape[-1])
    else:
        q_next = F.pad(draft_probs, (0, 0, 0, 1))[rows, kept]
    residual = (p_next - q_next * refused).clamp(min=0)  # multinomial normalizes it
    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)

    tokens = torch.where(positions < kept[:, None], F.pad(drafted, (0, 1)), -1)
    tokens[rows, kept] = extra
    return tokens, kept + 1
