"""Turning logits into next tokens.

Greedy requests take the argmax (and if the whole batch is greedy, nothing else is computed).
Otherwise, per request: divide by the temperature, keep the top-k logits, then keep the smallest set
of tokens whose probability adds up to top-p, and draw from what is left.

`Sampler.sample` is the one place that rule is written: a request with its own seed is drawn again
by it, alone, with a generator of its own (minisgl/engine/request_sampling.py), so a step added
to the rule (a mask on the logits, another filter) reaches every row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, List, Tuple

import torch

from minisgl.core import SamplingParams


@dataclass
class BatchSamplingArgs:
    """Per-request sampling settings as tensors; `None` temperatures means everybody is greedy."""

    temperatures: torch.Tensor | None  # [B] float32, 0 for greedy rows
    top_k: torch.Tensor | None  # [B] int64, vocab size where off
    top_p: torch.Tensor | None  # [B] float32
    # What single requests ask beyond the batched draw (minisgl/engine/request_sampling.py), set
    # by the scheduler after the batch is prepared: (row, generator seed) of each seeded sampled
    # row, and which rows' logprobs to compute; `logprobs_out` is filled in by the step.
    seeds: List[Tuple[int, int]] | None = None
    logprob_plan: Any = None
    logprobs_out: Any = None

    def rows(self, rows: slice) -> "BatchSamplingArgs":
        """The draw settings of some rows only, as a batch of their own (every per-row tensor
        sliced; what a single request asks beyond the draw is not carried)."""
        per_row = {
            f.name: value[rows]
            for f in fields(self)
            if isinstance(value := getattr(self, f.name), torch.Tensor)
        }
        return BatchSamplingArgs(**{"temperatures": None, "top_k": None, "top_p": None, **per_row})

    @classmethod
    def from_params(
        cls, params: List[SamplingParams], vocab_size: int, device: torch.device
    ) -> "BatchSamplingArgs":
        """The draw settings of a batch, one row per request in the order of `params`.

        Receives: `params`, each request's SamplingParams in batch order; `vocab_size`, the model's
            (a top_k of -1, or one above it, becomes it); `device`, where the sampler will run:
            the scheduler's `self.device`.
        Returns: a BatchSamplingArgs whose temperatures (float32, 0 for a greedy row), top_k
            (int64) and top_p (float32) are [B] tensors on `device`; all three None when every
            request is greedy (the sampler then takes the argmax).
        Leaves: `params` unchanged.
        """
        if not isinstance(device, torch.device):  # "cpu" would fail below as a bare AttributeError
            raise TypeError(
                f"BatchSamplingArgs.from_params: device must be a torch.device (the scheduler's "
                f"self.device), got {type(device).__name__} {device!r}"
            )
        if all(p.is_greedy for p in params):
            return cls(None, None, None)
        temps = torch.tensor(
            [0.0 if p.is_greedy else p.temperature for p in params], dtype=torch.float32
        )
        top_k = torch.tensor(
            [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params]
        )
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        if (
            device.type == "cuda"
        ):  # page-locked + non_blocking: the scheduler does not wait for the copy
            return cls(
                *(t.pin_memory().to(device, non_blocking=True) for t in (temps, top_k, top_p))
            )
        return cls(temps.to(device), top_k.to(device), top_p.to(device))


def top_k_top_p_filter(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k, then outside its top-p nucleus.

    Top-p works on what top-k left, renormalized: a token stays while the probability mass of the
    more likely tokens before it is still below p, so the most likely token always stays. A top-p
    of 1.0 means off: such a row skips the nucleus cut (in float32 the running mass reaches 1.0
    before the vocabulary ends, so a comparison with 1.0 would still cut the tail).

    Receives: `logits` [B, V] float (already divided by temperature); `top_k` [B] int64 (V where
        off); `top_p` [B] float32 in (0, 1] (1.0 where off). Each row has its own settings.
    Returns: a new [B, V] tensor: the kept logits unchanged, every other entry -inf.
    Leaves: nothing changed (a pure function).
    Uses: only torch (sort, softmax, cumsum, scatter).
    Checked: exactly k tokens survive top-k, ties included; top-p keeps the token that reaches p and
        removes the ones after it; filters that are off keep every token, also next to a filtered
        row; sampling never leaves the top-k or the nucleus and follows its renormalized
        distribution.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # a token stays if the mass *before* it is still below top_p (so the first token always stays)
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p = 1 means "off": in float32 the running total can reach 1.0 before the vocabulary ends,
    # so comparing against it would still cut the tail. Such rows skip the nucleus cut.
    cut = (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1.0)
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


class Sampler:
    def __init__(self, device: torch.device, seed: int | None = None) -> None:
        self.generator = torch.Generator(device=device)
        if seed is not None:
            self.generator.manual_seed(seed)

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """Pick each row's next token from its logits: the argmax for greedy rows, else a draw.

        A sampled row draws from softmax(top_k_top_p_filter(logits / T)) in float32. A greedy row
        (T = 0) keeps its argmax next to sampled rows, so no division by 0 may reach it (its
        probabilities would be nan). Every draw comes from `self.generator`: a seed repeats a run.

        Receives: `logits` [B, V] (any float dtype); `args`, a BatchSamplingArgs: `temperatures` [B]
            float32 (0 for a greedy row), `top_k`, `top_p` [B], or all three None when every row is
            greedy.
        Returns: next token ids [B], int32.
        Leaves: the sampler's random generator advanced (only when some row is sampled).
        Uses: `top_k_top_p_filter` (ch06), `self.generator` (with `torch.multinomial`).
        Checked: an all-greedy batch takes each row's argmax; greedy rows stay greedy next to
            sampled ones; draws follow softmax(logits / T), within top-k and the renormalized
            nucleus, with each row's own settings; T near 0 is the argmax; a seed makes runs
            reproducible; tokens are int32.
        """
        greedy = logits.argmax(dim=-1)
        if args.temperatures is None:
            return greedy.to(torch.int32)
        temps = args.temperatures.clamp_min(1e-6).unsqueeze(1)
        filtered = top_k_top_p_filter(logits.float() / temps, args.top_k, args.top_p)
        probs = filtered.softmax(dim=-1)
        drawn = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return torch.where(args.temperatures == 0, greedy, drawn).to(torch.int32)
