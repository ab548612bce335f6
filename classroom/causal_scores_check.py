"""Two rules of chapter 17's `causal_scores` asked of the helper itself, from a kernel that calls it
on one block of scores.

* Its scores come back float32, the dtype of the raw scores it was given: the online softmax
  takes their max and exponentiates them in float32, and a score rounded to bfloat16 is off by
  up to 0.4 % before anything else happens. Asked with a `tl.static_assert` on the returned dtype,
  checked by the interpreter as it runs and by a GPU as it compiles, and, for scores cast to a
  16-bit type and back (float32 again), by comparing each kept score with s * scale exactly; a
  comparison of the attention's output only says the numbers are a little off, not why.
* A hidden key loses to every visible one. `-inf` does; so does a finite value no score reaches
  (`-1e30`). A value a real score can go below (`-1e4`) does not: with every visible score near
  `-5e4` (a query and keys pointing apart, large) the hidden key becomes the row's maximum and
  takes the whole softmax. The attention tests' random scores stay within a few units of 0, where
  such a value looks like `-inf`.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import minisgl.kernel.triton_prefill as prefill  # the helper now there (a learner's, once swapped)

from .kernels import _forget_compiled

FLOAT32 = "causal_scores returned"
BLOCK = 16


@triton.jit
def _one_block_of_scores(S, OUT, scale, len_q, len_k):
    m = tl.arange(0, 16)
    offs = tl.arange(0, 16)
    s = tl.load(S + m[:, None] * 16 + offs[None, :])
    out = prefill.causal_scores(s, offs, m, len_q, len_k, scale)
    tl.static_assert(
        out.dtype != tl.bfloat16,
        "causal_scores returned the scores in bfloat16; the contract returns float32 scores",
    )
    tl.static_assert(
        out.dtype == tl.float32,
        "causal_scores returned the scores in another dtype than float32; the contract returns "
        "float32 scores",
    )
    tl.store(OUT + m[:, None] * 16 + offs[None, :], out)


def _scores(raw: torch.Tensor, scale: float, device) -> torch.Tensor:
    # compiled on a GPU for the helper it called last time: compile again for the one there now
    _forget_compiled(sys.modules[__name__])
    out = torch.empty(BLOCK, BLOCK, device=device)
    # 16 new tokens after no cached prefix: query m sees keys 0 to m
    _one_block_of_scores[(1,)](raw, out, scale, BLOCK, BLOCK)
    return out.cpu()


def _scores_or_dtype_problem(raw: torch.Tensor, scale: float, device) -> torch.Tensor | str:
    try:
        return _scores(raw, scale, device)
    except Exception as e:  # AssertionError in the interpreter, a CompilationError on a GPU
        said = str(e)
        if FLOAT32 not in said:
            raise
        start = said.index(FLOAT32)
        end = said.index("float32 scores", start) + len("float32 scores")
        return said[start:end].replace("causal_scores returned the scores", "the scores come back")


def scores_dtype_problem(device: torch.device | str = "cpu") -> str:
    """ "" when the helper returns float32 scores for float32 raw scores, each visible one exactly
    s * scale, else what it returned: its dtype, or the scores a round trip through a 16-bit type
    rounded (their dtype float32 again, so only their values show it), or visible scores that are
    not s * scale at all."""
    raw = torch.randn(BLOCK, BLOCK)
    scale = 0.25  # a power of two: s * scale is exact, however the helper writes the product
    got = _scores_or_dtype_problem(raw.to(device), scale, device)
    if isinstance(got, str):
        return got
    want = raw * scale
    # where the mask keeps the score (a mask off by one is the causal rule's, told by its checks)
    kept = torch.ones(BLOCK, BLOCK).tril().bool() & got.isfinite()
    wrong = kept & (got != want)
    if not wrong.any():
        return ""
    q, k = (int(i) for i in wrong.nonzero()[0])
    seen = f"query {q}, key {k}: got {float(got[q, k]):.8g}, s * scale is {float(want[q, k]):.8g}"
    # a 16-bit round trip moves each score by at most 2**-9 of it in bfloat16 (less in float16,
    # but up to its smallest step, 2**-24, near 0); two of them (the product taken in bfloat16
    # too) by twice that. A scale gone wrong is a factor, far outside.
    rounded = ((got - want).abs() <= want.abs() * 2**-7 + 2**-23)[kept].all()
    if rounded:
        worst = float(((got - want).abs() / want.abs().clamp_min(1e-30))[kept].max()) * 100
        return (
            "the scores stay float32: each trip through a 16-bit type rounds a score by up to "
            f"0.4 % (here they moved by up to {worst:.2g} %; {seen})"
        )
    return f"the visible scores should be s * scale exactly ({seen})"


def hidden_key_problem(device: torch.device | str = "cpu") -> str:
    """ "" when every hidden key of a block whose visible scores are all near -5e4 scores below
    every visible one of its row (-inf, or a value no score reaches), else what it scored (or
    the dtype problem, where the scores do not come back float32)."""
    scale = 0.125
    # scaled scores between -6e4 and -5e4: a query and keys pointing apart
    raw = -(5e4 + 1e4 * torch.rand(BLOCK, BLOCK)) / scale
    out = _scores_or_dtype_problem(raw.to(device), scale, device)
    if isinstance(out, str):  # not comparable: the dtype rule's problem, said as that rule says it
        return out
    visible = torch.ones(BLOCK, BLOCK).tril().bool()
    lowest_seen = out.masked_fill(~visible, float("inf")).amin(dim=1)
    hidden_best = out.masked_fill(visible, float("-inf")).amax(dim=1)
    # a row whose visible keys are not all kept (a mask off by one) breaks the causal rule, which
    # the attention checks name; this rule is about what a hidden key scores
    kept = out.masked_fill(~visible, 0.0).isfinite().all(dim=1)
    beaten = kept & ((hidden_best >= lowest_seen) | hidden_best.isnan())
    if not beaten.any():
        return ""
    row = int(beaten.nonzero()[0])
    if out[row][~visible[row]].unique().numel() > 1:  # scores, not one mask value: left unmasked
        return (
            f"query {row}'s keys after its own position kept their scores (up to "
            f"{float(hidden_best[row]):.4g}): they are not masked at all and take part in the "
            "softmax (query m sees keys 0 to its position only)"
        )
    return (
        f"with every visible score between -6e4 and -5e4, query {row}'s hidden keys scored "
        f"{float(hidden_best[row]):g}, its visible ones down to {float(lowest_seen[row]):.4g}: "
        "the hidden keys win the softmax"
    )
