"""What a request may ask of the sampler beyond a draw from the batch's generator: its own seed,
and log-probabilities (of its sampled tokens, of its prompt's tokens).

The batch's fast path is untouched: `Sampler.sample` draws every row at once, and only the rows
that ask for more are worked on after it, so a batch where nobody asks costs nothing extra.

Seeds. A seeded row is drawn again, alone, from a generator seeded with (seed, position): the
position of the token being drawn, not a count of draws, so the same request draws the same
tokens whatever else is in the batch, however its prompt was split into chunks (a chunk's junk
draw uses nothing of the request's), and on every tensor-parallel rank (each rank plans the same
batch from the same messages and samples from the same gathered logits).

Logprobs are log_softmax of the raw logits in float32 (before temperature, top-k, top-p: what the
model says, as OpenAI reports them). Prompt logprobs need the logits of every prompt position, which
the LM head computes only when a batch lists them (`Batch.logit_rows`); the scheduler plans which
(minisgl/scheduler/extras.py). Results land in host tensors on the engine stream, before the
step's `copy_done` is recorded, so the scheduler reads them when it reads the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from .sampler import BatchSamplingArgs, Sampler

_MASK = (1 << 63) - 1


def position_seed(seed: int, position: int) -> int:
    """The generator seed of a seeded request's draw at `position` (a fixed mix of the two)."""
    return (seed * 6364136223846793005 + (position + 1) * 1442695040888963407) & _MASK


@dataclass
class LogprobPlan:
    """Which logits rows a step scores, built by the scheduler on the host and moved to the device.

    `sample_rows` [B]: the row of `logits` each request samples from, when the LM head computed
    more rows than one per request (None: row i is request i). `token_rows` [G]: the requests (batch
    index) whose sampled token is scored. `prompt_rows` [R] and `prompt_targets` [R]: logits rows of
    prompt positions and the prompt token each one predicts. `k`: the most alternatives any of
    them asks for. `prompt_spans`: (uid, rows, its k) of each request's prompt rows, in order
    (the host needs them when the step is handled, when the requests' lengths have moved on)."""

    k: int
    sample_rows: torch.Tensor | None = None
    token_rows: torch.Tensor | None = None
    prompt_rows: torch.Tensor | None = None
    prompt_targets: torch.Tensor | None = None
    prompt_spans: List[Tuple[int, int, int]] = field(default_factory=list)
    token_rows_host: List[int] = field(default_factory=list)  # token_rows, as the host has them


@dataclass
class StepLogprobs:
    """One step's logprobs on the host (valid once the step's copy_done has completed):
    `token_*` per scored request (in LogprobPlan.token_rows order), `prompt_*` per prompt row."""

    token_lp: torch.Tensor | None = None  # [G] float32
    token_top_ids: torch.Tensor | None = None  # [G, k] int64
    token_top_lp: torch.Tensor | None = None  # [G, k] float32
    prompt_lp: torch.Tensor | None = None  # [R]
    prompt_top_ids: torch.Tensor | None = None  # [R, k]
    prompt_top_lp: torch.Tensor | None = None  # [R, k]


class RequestSampler(Sampler):
    """The engine's sampler: the batched draw, then what individual requests asked for."""

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        plan: LogprobPlan | None = getattr(args, "logprob_plan", None)
        last = logits
        if plan is not None and plan.sample_rows is not None:
            last = logits[plan.sample_rows]
        tokens = super().sample(last, args)
        seeds: List[Tuple[int, int]] | None = getattr(args, "seeds", None)
        if seeds:
            tokens = self._draw_seeded(last, args, seeds, tokens)
        if plan is not None:
            args.logprobs_out = self._logprobs(logits, last, tokens, plan)
        return tokens

    def _draw_seeded(self, logits, args, seeds, tokens) -> torch.Tensor:
        """Each seeded row drawn again, alone, by the batch's own draw rule (`Sampler.sample`)
        with a generator of its (seed, position)."""
        tokens = tokens.clone()
        for row, seed in seeds:
            r = slice(row, row + 1)
            tokens[r] = Sampler(logits.device, seed).sample(logits[r], args.rows(r))
        return tokens

    def _logprobs(self, logits, last, tokens, plan: LogprobPlan) -> StepLogprobs:
        out: Dict[str, torch.Tensor] = {}
        if plan.token_rows is not None:
            lsm = torch.log_softmax(last[plan.token_rows].float(), dim=-1)
            chosen = tokens[plan.token_rows].to(torch.int64).unsqueeze(1)
            out["token_lp"] = lsm.gather(1, chosen).squeeze(1)
            if plan.k:
                out["token_top_lp"], out["token_top_ids"] = lsm.topk(plan.k, dim=-1)
        if plan.prompt_rows is not None:
            lsm = torch.log_softmax(logits[plan.prompt_rows].float(), dim=-1)
            out["prompt_lp"] = lsm.gather(1, plan.prompt_targets.unsqueeze(1)).squeeze(1)
            if plan.k:
                out["prompt_top_lp"], out["prompt_top_ids"] = lsm.topk(plan.k, dim=-1)
        return StepLogprobs(**{name: _to_host(t) for name, t in out.items()})


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy that does not make the CPU wait (page-locked, on the engine stream)."""
    if t.device.type != "cuda":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)
