"""Chapter 24: the acceptance rules of a verify step, `verify_greedy` and `verify_sampled`.

- `verify_greedy`: the longest prefix of the draft that agrees with the target's argmax, then the
  target's token after it (the correction, or the bonus token); padding never kept; -1 after the
  count; a per-row Python oracle on random batches.
- `verify_sampled`: exactness, by chi-square tests over 20,000 rows drawn at once: the first
  emitted token follows the target's p_0 and the pair (first token, count) follows
  min(p, q) / max(p - q, 0), whatever the draft (adversarial, equal to the target, sure of an
  unlikely token, deterministic); the token after an accepted one follows the target's
  distribution at that position; one-hot targets give `verify_greedy`'s answer; the same
  generator state gives the same result, whatever torch's default generator did.

Each chi-square check fails a correct sampler with probability 1e-6 over random seeds (its
false-alarm rate); with the seeds fixed here every run is the same. Every known-wrong sampler
moves a statistic hundreds of times past its bound.
"""

from __future__ import annotations

import math
from typing import List

import pytest
import torch
import torch.nn.functional as F

from helpers import test_device
from minisgl.speculative.accept import verify_greedy, verify_sampled
from refusals import refuses

ROWS = 20_000
FALSE_ALARM = 1e-6
# a target's distribution over a vocabulary of 6, and drafts that disagree with it in every way
P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
DRAFTS = {
    "adversarial": torch.tensor([0.02, 0.03, 0.05, 0.10, 0.30, 0.50]),
    "equal": P.clone(),
    "unlikely-one-hot": F.one_hot(torch.tensor(5), 6).float(),
    "close": torch.tensor([0.30, 0.30, 0.20, 0.10, 0.05, 0.05]),
}


def _device() -> torch.device:
    return torch.device(test_device())


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=_device()).manual_seed(seed)


def _chi_square_bound(df: int, alpha: float = FALSE_ALARM) -> float:
    """The chi-square quantile 1 - alpha by Wilson and Hilferty's cube-root approximation (good
    to about 1 % for df >= 2 at these tails: far closer than the failures it has to tell)."""
    z = float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(1.0 - alpha)))
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _assert_follows(counts: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    """counts [C] of draws against probabilities [C]: impossible cells never drawn, the rest by a
    chi-square test with FALSE_ALARM as its false-alarm rate."""
    counts, probs = counts.double().cpu(), probs.double().cpu()
    n = float(counts.sum())
    impossible = probs <= 1e-12
    cells = impossible.nonzero().flatten().tolist()
    assert not bool(counts[impossible].any()), (
        f"{what}: cells {cells}, of probability 0 under the target, were drawn "
        f"{counts[impossible].long().tolist()} times"
    )
    seen, expected = counts[~impossible], probs[~impossible] * n
    stat = float(((seen - expected) ** 2 / expected).sum())
    bound = _chi_square_bound(int((~impossible).sum()) - 1)
    assert stat <= bound, (
        f"{what}: the counts do not follow the target's distribution: chi-square {stat:.1f} > "
        f"{bound:.1f} (false-alarm rate {FALSE_ALARM:g}); seen {seen.long().tolist()}, expected "
        f"{[round(x) for x in expected.tolist()]}"
    )


def _drafts_from(q: torch.Tensor, k: int, seed: int):
    """ROWS drafts of k tokens each drawn from q (as a drafter that samples does), and q as
    draft_probs [ROWS, k, V]."""
    dev = _device()
    q_rows = q.to(dev).expand(ROWS * k, -1)
    draft = torch.multinomial(q_rows, 1, generator=_gen(seed)).view(ROWS, k)
    return draft, q.to(dev).expand(ROWS, k, -1).clone()


def _target(k: int) -> torch.Tensor:
    return P.to(_device()).expand(ROWS, k + 1, -1).clone()


def _full(k: int) -> torch.Tensor:
    return torch.full((ROWS,), k, dtype=torch.int64, device=_device())


# ---------------------------------------------------------------- greedy


def _oracle(draft: List[int], draft_len: int, target: List[int]):
    n = 0
    while n < draft_len and draft[n] == target[n]:
        n += 1
    return target[: n + 1] + [-1] * (len(target) - n - 1), n + 1


def _greedy(draft, draft_len, target):
    dev = _device()
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    tokens, count = verify_greedy(t(draft), t(draft_len), t(target))
    return tokens.tolist(), count.tolist()


def test_greedy_keeps_the_agreeing_prefix_then_the_targets_token():
    tokens, count = _greedy([[5, 6, 7, 8]], [4], [[5, 6, 9, 1, 2]])
    assert (tokens, count) == ([[5, 6, 9, -1, -1]], [3]), (
        f"draft [5, 6, 7, 8] against the target's argmax [5, 6, 9, 1, 2] gave tokens {tokens}, "
        f"count {count}: keep 5, 6 (they agree), then the target's own 9 (the correction), "
        "then -1"
    )
    tokens, count = _greedy([[4, 6, 7, 8]], [4], [[5, 6, 7, 8, 2]])
    assert (tokens, count) == ([[5, -1, -1, -1, -1]], [1]), (
        f"a draft wrong from its first token gave tokens {tokens}, count {count}: only the "
        "target's own token, as a plain decode step"
    )


def test_greedy_adds_the_bonus_token_when_all_are_kept():
    tokens, count = _greedy([[5, 6, 7, 8]], [4], [[5, 6, 7, 8, 3]])
    assert (tokens, count) == ([[5, 6, 7, 8, 3]], [5]), (
        f"a draft the target agrees with entirely gave tokens {tokens}, count {count}: all four, "
        "then the bonus token the target predicted after the last one (count k + 1 = 5)"
    )


def test_greedy_never_keeps_padding():
    tokens, count = _greedy(
        [[5, 6, 7, 8], [5, -1, -1, -1]], [2, 1], [[5, 6, 7, 8, 3], [5, 9, 9, 9, 9]]
    )
    assert (tokens, count) == ([[5, 6, 7, -1, -1], [5, 9, -1, -1, -1]], [3, 2]), (
        f"drafts of lengths 2 and 1 padded to 4 gave tokens {tokens}, count {count}: entries "
        "past draft_len are padding, never kept even where they equal the target's token; the "
        "target's token after the real draft is the bonus"
    )
    tokens, count = _greedy([[5, 6, 7]], [0], [[5, 6, 7, 8]])
    assert (tokens, count) == ([[5, -1, -1, -1]], [1]), (
        f"draft_len 0 gave tokens {tokens}, count {count}: the target's token alone"
    )


def test_greedy_rows_match_a_row_by_row_oracle():
    gen = torch.Generator().manual_seed(3)
    batch, k, vocab = 64, 5, 3  # a small vocabulary: long agreeing runs are common
    target = torch.randint(vocab, (batch, k + 1), generator=gen)
    noise = torch.randint(vocab, (batch, k), generator=gen)
    draft = torch.where(torch.rand(batch, k, generator=gen) < 0.7, target[:, :k], noise)
    draft_len = torch.randint(k + 1, (batch,), generator=gen)
    before = (draft.clone(), draft_len.clone(), target.clone())
    tokens, count = _greedy(draft.tolist(), draft_len.tolist(), target.tolist())
    for i in range(batch):
        want = _oracle(draft[i].tolist(), int(draft_len[i]), target[i].tolist())
        assert (tokens[i], count[i]) == (want[0], want[1]), (
            f"row {i}: draft {draft[i].tolist()} (draft_len {int(draft_len[i])}) against "
            f"{target[i].tolist()} gave {tokens[i]}, count {count[i]}; expected {want[0]}, "
            f"count {want[1]}"
        )
    dev = _device()
    args = [x.to(dev) for x in before]
    verify_greedy(*args)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(args, before)), "an input was changed"


@pytest.mark.parametrize(
    "args, named",
    [
        (([[1, 2]], [3], [[1, 2, 3]]), "draft_len"),
        (([[1, 2]], [-1], [[1, 2, 3]]), "draft_len"),
        (([[1, 2]], [2], [[1, 2]]), "target"),
        (([[1, 2]], [2, 2], [[1, 2, 3]]), "draft_len"),
        (([1, 2], [2], [[1, 2, 3]]), "draft"),
    ],
    ids=["past-k", "negative", "target-short", "rows", "draft-1d"],
)
def test_greedy_refuses_bad_inputs_by_name(args, named):
    dev = _device()
    with refuses(ValueError, f"verify_greedy{tuple(args)}", match=named):
        verify_greedy(*(torch.tensor(a, dtype=torch.int64, device=dev) for a in args))


# ---------------------------------------------------------------- sampled


@pytest.mark.parametrize("kind", list(DRAFTS) + ["deterministic"])
def test_sampled_first_token_follows_the_target(kind):
    k = 3
    if kind == "deterministic":  # prompt lookup: always the unlikely token 5, draft_probs None
        draft, q = torch.full((ROWS, k), 5, dtype=torch.int64, device=_device()), None
    else:
        draft, q = _drafts_from(DRAFTS[kind], k, seed=1)
    tokens, count = verify_sampled(draft, _full(k), q, _target(k), _gen(2))
    first = torch.bincount(tokens[:, 0], minlength=6)
    _assert_follows(first, P, f"with the {kind} draft, the first emitted token")


@pytest.mark.parametrize("kind", list(DRAFTS) + ["deterministic"])
def test_sampled_pairs_of_token_and_count_follow_min_and_residual(kind):
    # k = 1: the first token y is the draft kept (count 2) with probability min(p(y), q(y)), or
    # the replacement (count 1) with probability max(p(y) - q(y), 0)
    if kind == "deterministic":
        draft, q, q_law = (
            torch.full((ROWS, 1), 5, device=_device()),
            None,
            DRAFTS["unlikely-one-hot"],
        )
    else:
        draft, q = _drafts_from(DRAFTS[kind], 1, seed=3)
        q_law = DRAFTS[kind]
    tokens, count = verify_sampled(draft, _full(1), q, _target(1), _gen(4))
    cells = torch.bincount(tokens[:, 0] * 2 + (count - 1), minlength=12)
    law = torch.stack([(P - q_law).clamp(min=0), torch.minimum(P, q_law)], dim=1).flatten()
    _assert_follows(
        cells,
        law,
        f"with the {kind} draft, k = 1, the pairs (first token, count) in the order "
        "(0, 1), (0, 2), (1, 1), ...",
    )


def test_sampled_token_after_a_kept_one_follows_the_target_there():
    # the target's distribution at position 1 depends on the token at position 0: after token y,
    # it is P rolled by y. The second emitted token must follow it, whatever the draft.
    k = 2
    draft, q = _drafts_from(DRAFTS["close"], k, seed=5)
    target = _target(k)
    rolled = torch.stack([P.roll(y) for y in range(6)]).to(_device())
    target[:, 1] = rolled[draft[:, 0]]
    tokens, count = verify_sampled(draft, _full(k), q, target, _gen(6))
    kept = count >= 2
    cells = torch.bincount(tokens[kept, 0] * 6 + tokens[kept, 1], minlength=36)
    given_first = torch.bincount(tokens[kept, 0], minlength=6).double().cpu()
    law = (rolled.double().cpu() * (given_first / given_first.sum())[:, None]).flatten()
    _assert_follows(cells, law, "after a kept first token, the pairs (first, second token)")


def test_sampled_bonus_token_when_the_whole_draft_is_kept():
    # a draft equal to the target at every position is always kept: count k + 1, and the bonus
    # token follows the target's last position
    k = 2
    draft, q = _drafts_from(P, k, seed=7)
    tokens, count = verify_sampled(draft, _full(k), q, _target(k), _gen(8))
    assert bool((count == k + 1).all()), (
        f"a draft drawn from the target's own distribution is always kept, so every row yields "
        f"k + 1 = {k + 1} tokens; counts seen {torch.bincount(count, minlength=k + 2).tolist()}"
    )
    _assert_follows(torch.bincount(tokens[:, k], minlength=6), P, "the bonus token")


def test_sampled_never_keeps_padding():
    # the target is sure of token 5 everywhere and the padding is token 5: still never kept
    k = 3
    target = F.one_hot(torch.tensor(5), 6).float().to(_device()).expand(4, k + 1, -1).clone()
    draft = torch.full((4, k), 5, dtype=torch.int64, device=_device())
    draft_len = torch.tensor([0, 1, 2, 3], device=_device())
    tokens, count = verify_sampled(draft, draft_len, None, target, _gen(0))
    assert count.tolist() == [1, 2, 3, 4], (
        f"drafts of lengths 0..3 that the target agrees with entirely gave counts "
        f"{count.tolist()}: draft_len + 1 each (padding is never kept, and the bonus follows)"
    )
    assert tokens.tolist() == [[5, -1, -1, -1], [5, 5, -1, -1], [5, 5, 5, -1], [5, 5, 5, 5]], (
        f"tokens {tokens.tolist()}: -1 after the count"
    )


@pytest.mark.parametrize("with_probs", [False, True], ids=["draft_probs-None", "draft_probs"])
def test_sampled_with_one_hot_targets_is_verify_greedy(with_probs):
    gen = torch.Generator().manual_seed(9)
    batch, k, vocab = 256, 4, 3
    target_argmax = torch.randint(vocab, (batch, k + 1), generator=gen)
    noise = torch.randint(vocab, (batch, k), generator=gen)
    draft = torch.where(torch.rand(batch, k, generator=gen) < 0.7, target_argmax[:, :k], noise)
    draft_len = torch.randint(k + 1, (batch,), generator=gen)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1) if with_probs else None
    dev = _device()
    want = verify_greedy(draft.to(dev), draft_len.to(dev), target_argmax.to(dev))
    got = verify_sampled(
        draft.to(dev),
        draft_len.to(dev),
        None if q is None else q.to(dev),
        F.one_hot(target_argmax, vocab).float().to(dev),
        _gen(10),
    )
    for i in range(batch):
        assert got[0][i].tolist() == want[0][i].tolist() and int(got[1][i]) == int(want[1][i]), (
            f"row {i}: with a greedy (one-hot) target, draft {draft[i].tolist()} (draft_len "
            f"{int(draft_len[i])}) against argmax {target_argmax[i].tolist()} gave "
            f"{got[0][i].tolist()}, count {int(got[1][i])}; verify_greedy gives "
            f"{want[0][i].tolist()}, count {int(want[1][i])}"
        )


def test_sampled_draws_only_from_the_given_generator():
    k = 3
    draft, q = _drafts_from(DRAFTS["adversarial"], k, seed=11)
    target = _target(k)
    torch.manual_seed(0)
    first = verify_sampled(draft, _full(k), q, target, _gen(12))
    torch.manual_seed(1)  # torch's default generator elsewhere: must not matter
    again = verify_sampled(draft, _full(k), q, target, _gen(12))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]), (
        "the same generator state gave different tokens once torch's default generator moved: "
        "every random number must come from `generator`"
    )
    other = verify_sampled(draft, _full(k), q, target, _gen(13))
    assert not torch.equal(first[0], other[0]), "another generator seed gave the very same draws"


def test_sampled_refuses_draft_probs_of_the_wrong_shape():
    k = 2
    draft, q = _drafts_from(P, k, seed=0)
    with refuses(ValueError, "verify_sampled with draft_probs of 5 columns", match="draft_probs"):
        verify_sampled(draft, _full(k), q[:, :, :5], _target(k), _gen(0))
    with refuses(ValueError, "verify_sampled with draft_len past the drafts", match="draft_len"):
        verify_sampled(draft, _full(k) + 1, q, _target(k), _gen(0))
    with refuses(ValueError, "verify_sampled with a 1-D draft", match="draft must be"):
        verify_sampled(draft[0], _full(k)[:1], q[:1], _target(k)[:1], _gen(0))
