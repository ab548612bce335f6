"""Chapter 24: prompt lookup, `propose_lookup` (transformers' prompt-lookup rule).

Longer n-grams first; the earliest earlier occurrence of the request's last n tokens with a
continuation; the continuation cut at k and where the tokens end; the suffix itself never counted;
[] when nothing matches or k is 0; bad arguments a ValueError naming them.
"""

from __future__ import annotations

import pytest

from minisgl.speculative.lookup import propose_lookup
from refusals import refuses


def _said(tokens, k, **kw) -> str:
    return f"propose_lookup({tokens}, k={k}{''.join(f', {a}={b}' for a, b in kw.items())})"


def test_lookup_takes_the_earliest_occurrence():
    tokens = [1, 2, 7, 8, 1, 2, 5, 6, 1, 2]
    got = propose_lookup(tokens, 2, max_ngram=2)
    assert got == [7, 8], (
        f"{_said(tokens, 2, max_ngram=2)} gave {got}: [1, 2] occurs at 0 and at 4; the draft is "
        "what followed the earliest occurrence"
    )


def test_lookup_tries_the_longest_ngram_first():
    tokens = [3, 9, 9, 1, 2, 3, 4, 4, 1, 2, 3]
    got = propose_lookup(tokens, 2, max_ngram=3)
    assert got == [4, 4], (
        f"{_said(tokens, 2, max_ngram=3)} gave {got}: the 3-gram [1, 2, 3] occurs at 3, so it "
        "wins over the earlier 1-gram [3] at 0 (a longer match is better evidence)"
    )


def test_lookup_falls_back_to_a_shorter_ngram():
    tokens = [5, 1, 8, 2, 1]
    got = propose_lookup(tokens, 2, max_ngram=3)
    assert got == [8, 2], (
        f"{_said(tokens, 2, max_ngram=3)} gave {got}: neither [8, 2, 1] nor [2, 1] occurs "
        "earlier, so the 1-gram [1] (at 1) gives the draft"
    )
    tokens = [2, 7, 1, 2, 8, 9, 1, 2]
    got = propose_lookup(tokens, 2, max_ngram=3)
    assert got == [8, 9], (
        f"{_said(tokens, 2, max_ngram=3)} gave {got}: [9, 1, 2] does not occur earlier, the "
        "2-gram [1, 2] does (at 2): every n is tried in turn, before the 1-gram [2] at 0"
    )


def test_lookup_respects_min_ngram():
    tokens = [5, 1, 8, 2, 1]
    got = propose_lookup(tokens, 2, max_ngram=3, min_ngram=2)
    assert got == [], (
        f"{_said(tokens, 2, max_ngram=3, min_ngram=2)} gave {got}: only a 1-gram matches, "
        "shorter than min_ngram"
    )
    got = propose_lookup([1, 2, 3, 1, 2], 1, max_ngram=2, min_ngram=2)
    assert got == [3], f"min_ngram = max_ngram = 2 tries the 2-gram alone; it gave {got}"


def test_lookup_cuts_the_continuation_at_k_and_where_the_tokens_end():
    tokens = [1, 2, 3, 1, 2]
    assert propose_lookup(tokens, 8, max_ngram=2) == [3, 1, 2], (
        f"{_said(tokens, 8, max_ngram=2)} gave {propose_lookup(tokens, 8, max_ngram=2)}: the "
        "continuation of [1, 2] at 0 is [3, 1, 2], and the tokens end there"
    )
    assert propose_lookup(tokens, 2, max_ngram=2) == [3, 1], (
        f"{_said(tokens, 2, max_ngram=2)} gave {propose_lookup(tokens, 2, max_ngram=2)}: at most "
        "k tokens"
    )
    overlapping = [4, 4, 4]
    assert propose_lookup(overlapping, 5, max_ngram=2) == [4], (
        f"{_said(overlapping, 5, max_ngram=2)} gave {propose_lookup(overlapping, 5, max_ngram=2)}"
        ": [4, 4] at 0 is followed by one token before the tokens end"
    )


def test_lookup_never_counts_the_suffix_itself():
    tokens = [1, 5, 2, 3, 1]
    got = propose_lookup(tokens, 3, max_ngram=3)
    assert got == [5, 2, 3], (
        f"{_said(tokens, 3, max_ngram=3)} gave {got}: the last 3 and last 2 tokens occur only "
        "as the suffix itself, which nothing follows, so they are not an occurrence; the 1-gram "
        "[1] at 0 gives the draft"
    )
    assert propose_lookup([1, 2, 3], 3) == [], "[1, 2, 3] repeats nothing: the draft is []"


@pytest.mark.parametrize("tokens", [[], [7], [1, 2, 3, 4]], ids=["empty", "one", "no-repeat"])
def test_lookup_without_a_match_is_empty(tokens):
    got = propose_lookup(tokens, 4)
    assert got == [], f"{_said(tokens, 4)} gave {got}: no earlier occurrence, so no draft"


def test_lookup_with_k_zero_is_empty():
    tokens = [1, 2, 1, 2]
    got = propose_lookup(tokens, 0)
    assert got == [], f"{_said(tokens, 0)} gave {got}: k = 0 asks for no draft"


def test_lookup_leaves_the_tokens_and_returns_a_new_list():
    tokens = [1, 2, 3, 1, 2]
    got = propose_lookup(tokens, 8)
    assert tokens == [1, 2, 3, 1, 2], f"the request's tokens became {tokens}"
    got.append(99)
    assert tokens == [1, 2, 3, 1, 2], "the draft shares storage with the request's tokens"
    from_tuple = propose_lookup((1, 2, 3, 1, 2), 8)
    assert from_tuple == [3, 1, 2] and isinstance(from_tuple, list), (
        f"from a tuple the draft must still be a list, got {from_tuple!r}"
    )


@pytest.mark.parametrize(
    "kw, named",
    [
        (dict(k=-1), "k"),
        (dict(k=2, min_ngram=0), "min_ngram"),
        (dict(k=2, max_ngram=1, min_ngram=2), "max_ngram"),
    ],
    ids=["negative-k", "zero-ngram", "min-over-max"],
)
def test_lookup_refuses_bad_arguments_by_name(kw, named):
    with refuses(ValueError, f"propose_lookup([1, 2, 1], {kw})", match=named):
        propose_lookup([1, 2, 1], **kw)
