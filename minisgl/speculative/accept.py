"""Verification of draft tokens: greedy acceptance and rejection sampling."""

from __future__ import annotations

import torch
from torch import Tensor


def _accepted_tokens(draft: Tensor, n: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
    """tokens [B, k+1]: the draft's first n[i] tokens, then last[i], then -1."""
    b, k = draft.shape
    cols = torch.arange(k + 1, device=draft.device).unsqueeze(0)
    padded = torch.cat([draft, torch.full((b, 1), -1, dtype=draft.dtype, device=draft.device)], 1)
    tokens = torch.where(cols < n.unsqueeze(1), padded, torch.full_like(padded, -1))
    tokens = tokens.scatter(1, n.unsqueeze(1), last.unsqueeze(1).to(tokens.dtype))
    return tokens.to(torch.int64), (n + 1).to(torch.int64)


def _prefix_len(ok: Tensor, draft_len: Tensor) -> Tensor:
    """The number of leading True entries of each row of `ok` [B, k], counting only the first
    draft_len[i] entries."""
    k = ok.shape[1]
    cols = torch.arange(k, device=ok.device).unsqueeze(0)
    ok = ok & (cols < draft_len.unsqueeze(1))
    return ok.to(torch.int64).cumprod(dim=1).sum(dim=1)


def verify_greedy(draft: Tensor, draft_len: Tensor, target_argmax: Tensor) -> tuple[Tensor, Tensor]:
    """draft [B, k] int64 (entries past draft_len[i] are padding, any value), draft_len [B] int64
    (0..k), target_argmax [B, k+1] int64: the target's argmax at each verified position (position j
    predicts the token after draft j-1; position 0 follows the request's last token).
    Returns (tokens [B, k+1] int64, count [B] int64): row i accepts the longest prefix n of its
    draft (n <= draft_len[i]) equal to target_argmax[i, :n], then adds target_argmax[i, n] (the
    correction, or the bonus token when the whole draft was accepted); count = n + 1;
    tokens[i, count:] = -1."""
    k = draft.shape[1]
    n = _prefix_len(draft == target_argmax[:, :k], draft_len)
    last = target_argmax.gather(1, n.unsqueeze(1)).squeeze(1)
    return _accepted_tokens(draft, n, last)


def verify_sampled(
    draft: Tensor,
    draft_len: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023). target_probs [B, k+1, V]
    float32: the target's distribution at each position AFTER temperature/top-k/top-p (rows sum to
    1; a greedy row is one-hot at its argmax, which makes this reduce to verify_greedy).
    draft_probs [B, k, V] float32 or None: None means a deterministic drafter (q one-hot at the
    drafted token: prompt lookup, a greedy draft model).
    Row i, j = 0..: accept draft[i, j] with probability min(1, p(x)/q(x)); at the first rejection
    draw the replacement from normalize(max(p_j - q_j, 0)) and stop; if all draft_len[i] tokens
    were accepted draw the bonus token from p_{draft_len[i]}. Same returns as verify_greedy.
    Every draw comes from `generator` (None: torch's default): the same generator state gives the
    same result. Outputs follow the target's distribution exactly, whatever the draft proposed."""
    b, k = draft.shape
    vocab = target_probs.shape[-1]
    dev = target_probs.device
    safe = draft.clamp(0, vocab - 1)  # padding may be any value
    p_draft = target_probs[:, :k].gather(2, safe.unsqueeze(2)).squeeze(2)  # [B, k]
    if draft_probs is None:
        q = torch.nn.functional.one_hot(safe, vocab).to(target_probs.dtype)
    else:
        q = draft_probs
    q_draft = q.gather(2, safe.unsqueeze(2)).squeeze(2)
    u = torch.rand((b, k), generator=generator, device=dev, dtype=torch.float32)
    # accept with probability min(1, p/q): u < p/q, written without the division (q may be 0)
    ok = u * q_draft < p_draft
    n = _prefix_len(ok, draft_len)
    rows = torch.arange(b, device=dev)
    p_last = target_probs[rows, n]  # [B, V]: p at the stopping position
    rejected = n < draft_len
    q_last = q[rows, n.clamp(max=max(k - 1, 0))] if k > 0 else torch.zeros_like(p_last)
    residual = (p_last - q_last).clamp_min(0)
    mass = residual.sum(dim=1, keepdim=True)
    # a rejection means p < q somewhere, so the residual has mass; guard the float edge anyway
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_last)
    dist = torch.where(rejected.unsqueeze(1), residual, p_last)
    last = torch.multinomial(dist, 1, generator=generator).squeeze(1)
    return _accepted_tokens(draft, n, last)
