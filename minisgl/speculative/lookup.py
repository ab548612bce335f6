"""Prompt lookup: draft tokens found in the request's own tokens, no model."""

from __future__ import annotations


def propose_lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k draft tokens by prompt lookup (transformers' prompt-lookup decoding rule):
    for n = max_ngram down to min_ngram (n <= len(tokens) - 1): take the last n tokens; find the
    EARLIEST earlier occurrence of them in `tokens` whose continuation is not empty; return the up
    to k tokens that follow it (fewer where `tokens` ends first). The first n with such an
    occurrence wins. [] when nothing matches or k == 0. Pure: `tokens` is not changed."""
    if k <= 0:
        return []
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        if n < 1:
            break
        tail = tokens[length - n :]
        # an occurrence starting at i has continuation tokens[i + n:], not empty while i + n < L
        for i in range(0, length - n):
            if tokens[i : i + n] == tail:
                return list(tokens[i + n : i + n + k])
    return []
