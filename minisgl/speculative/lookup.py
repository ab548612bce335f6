"""Prompt lookup: draft tokens without a draft model.

Text that repeats itself (code being edited, a document being quoted, a list that follows a
pattern) often continues the way it continued the last time its latest few tokens appeared. So
the draft is what followed the earliest earlier occurrence of the request's last n tokens: no
model, no KV, only a search over tokens the request already has. This is transformers'
prompt-lookup decoding rule (`PromptLookupCandidateGenerator`), and SGLang's and vLLM's n-gram
drafters are variants of it.
"""

from __future__ import annotations

from typing import List, Sequence


def propose_lookup(
    tokens: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1
) -> List[int]:
    """Up to k draft tokens by prompt lookup over a request's own tokens.

    For n = max_ngram down to min_ngram, the last n tokens are looked for earlier in `tokens`;
    the first n that occurs earlier with at least one token after the occurrence wins, and its
    EARLIEST such occurrence gives the draft: the up to k tokens that follow it (fewer where
    `tokens` ends first). Longer n-grams first: a longer match is better evidence that the text
    repeats. The last n tokens themselves are not an occurrence (nothing follows them).

    Receives: `tokens`, the prompt and every accepted output token, the newest last; `k` >= 0,
        the most tokens to draft; 1 <= `min_ngram` <= `max_ngram`, the n-gram lengths tried.
    Returns: a new list of at most k ints; [] when no n-gram matches or k == 0.
    Leaves: `tokens` as it was (a pure function).
    Uses: `list` slices, which compare element by element; nothing of torch or the engine.
    Checked: the longest n first, then the earliest occurrence; the continuation cut where
        `tokens` ends; the suffix itself never counted; k = 0 and no match give []; a negative k
        or an n-gram range outside 1 <= min_ngram <= max_ngram is a ValueError naming it.
    """
    if k < 0:
        raise ValueError(f"k (the number of draft tokens) must be >= 0, got {k}")
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(
            f"the n-gram lengths must satisfy 1 <= min_ngram <= max_ngram, got "
            f"min_ngram={min_ngram}, max_ngram={max_ngram}"
        )
    tokens = list(tokens)  # a tuple or a tensor's list: the draft is a list all the same
    for n in range(max_ngram, min_ngram - 1, -1):
        suffix = tokens[-n:]
        # an occurrence at `start` has a continuation only if start + n < len(tokens); this
        # also leaves out the suffix itself, and every start when n >= len(tokens)
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []
