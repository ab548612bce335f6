"""Chapter 24's helpers: prompt lookup replayed over a greedy continuation, and the draws and
distances its try-outs use to check an acceptance rule against the target's distribution.

`replay` is what benchmarks/lookup_acceptance.py measures with: greedy verification keeps exactly
the target's own tokens, so a run with prompt lookup produces the plain greedy continuation, and
only the number of target forwards changes. Replaying the drafter over that continuation counts
them without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List

import torch

from minisgl.speculative.lookup import propose_lookup


@dataclass
class Replay:
    verifies: int  # target forwards that decode (the first token comes from the prefill)
    decode_steps: int  # what plain decoding needs for the same tokens
    accepted: int  # draft tokens kept, over all verifies
    drafted: int  # draft tokens proposed, over all verifies
    with_draft: int  # verifies whose draft was not empty

    @property
    def tokens_per_verify(self) -> float:
        return self.decode_steps / self.verifies


def propose_latest(tokens: List[int], k: int, max_ngram: int = 3) -> List[int]:
    """propose_lookup with the other choice of occurrence: the latest earlier one."""
    for n in range(max_ngram, 0, -1):
        for start in reversed(range(len(tokens) - n)):
            if tokens[start : start + n] == tokens[-n:]:
                return tokens[start + n : start + n + k]
    return []


def replay(
    prompt: List[int],
    output: List[int],
    k: int,
    max_ngram: int = 3,
    propose: Callable[..., List[int]] = propose_lookup,
) -> Replay:
    """Prompt lookup replayed over a greedy continuation: `output[0]` comes from the prefill,
    every later token from a verify step that accepts the agreeing prefix of its draft."""
    tokens = prompt + output[:1]
    verifies = accepted = drafted = with_draft = 0
    while len(tokens) < len(prompt) + len(output):
        draft = propose(tokens, k, max_ngram=max_ngram)
        truth = output[len(tokens) - len(prompt) :]
        kept = 0
        while kept < len(draft) and kept < len(truth) and draft[kept] == truth[kept]:
            kept += 1
        step = min(kept + 1, len(truth))  # the verify adds the target's own token after them
        tokens += truth[:step]
        verifies += 1
        accepted += kept
        drafted += len(draft)
        with_draft += bool(draft)
    return Replay(verifies, len(output) - 1, accepted, drafted, with_draft)


def drafts_from(q: torch.Tensor, rows: int, k: int, seed: int):
    """`rows` drafts of k tokens drawn from the distribution q [V] (a drafter that samples), and q
    as their draft_probs [rows, k, V]."""
    gen = torch.Generator().manual_seed(seed)
    draft = torch.multinomial(q.expand(rows * k, -1), 1, generator=gen).view(rows, k)
    return draft, q.expand(rows, k, -1).clone()


def distance(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total variation distance between the shares of `counts` and `probs`: half the summed
    absolute differences, 0 for the same distribution, 1 for disjoint ones."""
    shares = counts.double() / counts.sum()
    return float((shares - probs.double()).abs().sum() / 2)
