"""Chapter 26: the maths of a Gated DeltaNet layer, judged on tiny shapes.

- `delta_rule_recurrent`: equals transformers' own recurrence (an independent oracle), with a
  nonzero initial state, and leaves the caller's state as it was.
- `delta_rule_chunked`: equals transformers' recurrence at lengths that are not a multiple of the
  chunk, with a nonzero initial state, across several chunks.
- `causal_conv1d`: equals one convolution over the whole sequence when the sequence comes in
  chunks, and hands on the window of the last K - 1 inputs.
- `reset_new_rows` (the state slot's life): zeroes the window and the state of the requests
  whose step is their first, in every layer, and no other row: not a continued chunk's, not one
  the step does not hold.
- All four inside the engine: a tiny random Qwen3.5 gives transformers' greedy tokens with
  chunked prefill (3-token chunks) and more requests than slots; and requests taking turns in one
  slot with overlap on and deferred CPU streams (each one's last step still queued when the next
  is scheduled).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy
from hybrid_checkpoints import hybrid_checkpoint
from minisgl.env import ENV
from minisgl.kernel.delta_rule import (
    causal_conv1d,
    delta_rule_chunked,
    delta_rule_recurrent,
    l2_normalize,
)
from minisgl.kvcache.state_pool import StatePool, reset_new_rows
from refusals import refuses

TOL = dict(atol=2e-5, rtol=1e-4)


def _inputs(n: int, length: int, heads: int = 2, dk: int = 4, dv: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(n, length, heads, dk, generator=g)) * dk**-0.5
    k = l2_normalize(torch.randn(n, length, heads, dk, generator=g))
    v = torch.randn(n, length, heads, dv, generator=g)
    decay = -torch.rand(n, length, heads, generator=g) - 0.05  # log space, < 0
    beta = torch.rand(n, length, heads, generator=g)
    state = torch.randn(n, heads, dk, dv, generator=g)
    return q, k, v, decay, beta, state


def _oracle(q, k, v, g, beta, state):
    """transformers' recurrence (it normalizes and scales inside: give it q unscaled)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    out, final = hf.torch_recurrent_gated_delta_rule(
        q / q.shape[-1] ** -0.5, k, v, g=g, beta=beta, initial_state=state, output_final_state=True
    )
    return out, final


def _far(got: torch.Tensor, want: torch.Tensor) -> str:
    return f"differs by up to {float((got - want).abs().max()):.3g}"


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.allclose(got, want, **TOL)


# ---------------------------------------------------------------- one step at a time


@pytest.mark.parametrize("length", [1, 2, 7])
def test_recurrence_output_and_state_equal_transformers(length):
    q, k, v, g, beta, state = _inputs(2, length)
    want_out, want_state = _oracle(q, k, v, g, beta, state)
    out, new_state = delta_rule_recurrent(q, k, v, g, beta, state)
    assert out.shape == want_out.shape, f"the output is {tuple(out.shape)}, not [N, T, H, Dv]"
    assert new_state.shape == state.shape, (
        f"the state is {tuple(new_state.shape)}, not [N, H, Dk, Dv]"
    )
    assert _close(out, want_out), (
        f"{length} token(s): the outputs q^T S, read after the token's write, {_far(out, want_out)}"
    )
    assert _close(new_state, want_state), (
        f"{length} token(s): the state after decay then correction {_far(new_state, want_state)}"
    )


def test_recurrence_decays_the_state_before_it_corrects_it():
    # one token, beta 1, the decay strong: S1 = a S0 + k (v - a k^T S0)^T reads back v exactly
    q, k, v, _, _, state = _inputs(1, 1, heads=1)
    g = torch.full((1, 1, 1), -1.0)
    beta = torch.ones(1, 1, 1)
    _, new_state = delta_rule_recurrent(k * k.shape[-1] ** -0.5, k, v, g, beta, state)
    read = torch.einsum("k,kv->v", k[0, 0, 0], new_state[0, 0])
    assert torch.allclose(read, v[0, 0, 0], atol=1e-5), (
        f"with beta 1 the state must map k to v after the token; it reads {read.tolist()} for "
        f"{v[0, 0, 0].tolist()}: the decay was not applied before the correction was measured"
    )


def test_recurrence_leaves_the_given_state_as_it_was():
    q, k, v, g, beta, state = _inputs(2, 3)
    before = state.clone()
    delta_rule_recurrent(q, k, v, g, beta, state)
    assert torch.equal(state, before), (
        f"the caller's state changed by up to {float((state - before).abs().max()):.3g}: the "
        "engine keeps it in the state pool and writes the returned state back itself"
    )


# ---------------------------------------------------------------- whole chunks


@pytest.mark.parametrize("length,chunk", [(1, 4), (5, 4), (11, 4), (8, 8)])
def test_chunked_equals_transformers_recurrence(length, chunk):
    q, k, v, g, beta, state = _inputs(2, length, seed=length)
    want_out, want_state = _oracle(q, k, v, g, beta, state)
    out, new_state = delta_rule_chunked(q, k, v, g, beta, state, chunk=chunk)
    assert out.shape == want_out.shape, f"the output is {tuple(out.shape)}, not [N, T, H, Dv]"
    assert _close(out, want_out), (
        f"{length} tokens in chunks of {chunk}: the outputs {_far(out, want_out)}"
    )
    assert _close(new_state, want_state), (
        f"{length} tokens in chunks of {chunk}: the state after the last token "
        f"{_far(new_state, want_state)}"
    )


def test_chunked_starts_from_the_given_state():
    q, k, v, g, beta, state = _inputs(1, 3, seed=5)
    want_out, _ = _oracle(q, k, v, g, beta, state)
    out, _ = delta_rule_chunked(q, k, v, g, beta, state, chunk=4)
    zero_out, _ = _oracle(q, k, v, g, beta, torch.zeros_like(state))
    assert _close(out, want_out), (
        f"the outputs {_far(out, want_out)}; from a zero state they would differ by "
        f"{float((out - zero_out).abs().max()):.3g}: the initial state must be read"
    )


def test_chunked_padding_neither_decays_nor_writes_the_state():
    # 5 tokens in chunks of 4: 3 padding tokens after the last one must leave the state alone
    q, k, v, g, beta, state = _inputs(1, 5, seed=9)
    _, want_state = _oracle(q, k, v, g, beta, state)
    _, new_state = delta_rule_chunked(q, k, v, g, beta, state, chunk=4)
    ratio = float(new_state.norm() / want_state.norm())
    assert _close(new_state, want_state), (
        f"5 tokens in chunks of 4: the final state {_far(new_state, want_state)} (its norm is "
        f"{ratio:.3f} of the right one): the padding tokens must not decay or write it"
    )


# ---------------------------------------------------------------- the convolution


def _whole_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu of the causal depthwise convolution over the whole sequence, from zeros."""
    size = weight.shape[1]
    seq = F.pad(x.t(), (size - 1, 0))[None]
    return F.silu(F.conv1d(seq, weight[:, None], groups=weight.shape[0])[0].t())


@pytest.mark.parametrize("cuts", [[11], [2, 9], [4, 1, 6]], ids=["one", "2+9", "4+1+6"])
def test_convolution_in_chunks_equals_the_whole_sequence(cuts):
    g = torch.Generator().manual_seed(len(cuts))
    x = torch.randn(11, 5, generator=g)
    weight = torch.randn(5, 4, generator=g)
    window = torch.zeros(5, 3)
    outs, start = [], 0
    for n in cuts:
        out, window = causal_conv1d(x[start : start + n], window, weight)
        assert out.shape == (n, 5), f"a chunk of {n} tokens gave {tuple(out.shape)}, not [T, C]"
        assert window.shape == (5, 3), f"the window is {tuple(window.shape)}, not [C, K - 1]"
        outs.append(out)
        start += n
    got, want = torch.cat(outs), _whole_conv(x, weight)
    assert torch.allclose(got, want, atol=1e-5), (
        f"chunks of {cuts} tokens: the outputs {_far(got, want)} from one convolution over the "
        "whole sequence: each chunk must start from the window the last one left"
    )
    assert torch.equal(window, x[-3:].t()), (
        f"chunks of {cuts}: the final window must be the last K - 1 = 3 inputs, "
        f"{_far(window, x[-3:].t())}"
    )


def test_convolution_window_after_a_chunk_shorter_than_it():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, generator=g)
    old = torch.randn(2, 3, generator=g)
    _, window = causal_conv1d(x[:1], old, torch.randn(2, 4, generator=g))
    want = torch.cat([old[:, 1:], x[:1].t()], dim=1)
    assert torch.equal(window, want), (
        f"one new token after the window {old.tolist()}: the window must drop its oldest input "
        f"and end with the new one, {want.tolist()}; got {window.tolist()}"
    )


def test_convolution_keeps_the_inputs_dtype():
    x = torch.randn(3, 2).bfloat16()
    out, _ = causal_conv1d(x, torch.zeros(2, 3), torch.randn(2, 4))
    assert out.dtype == torch.bfloat16, f"bfloat16 inputs gave {out.dtype} outputs"


# ---------------------------------------------------------------- inside the engine


# ---------------------------------------------------------------- the state slot's life


def _random_pool() -> StatePool:
    """3 layers, 6 rows, every value nonzero: a zeroed row, or a row left alone, shows."""
    pool = StatePool(3, 6, 5, 4, 2, 3, 2, torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    pool.conv.copy_(torch.rand(pool.conv.shape, generator=g) + 0.5)
    pool.recurrent.copy_(torch.rand(pool.recurrent.shape, generator=g) + 0.5)
    return pool


def _row_changes(pool: StatePool, before: StatePool, row: int) -> str:
    conv = not torch.equal(pool.conv[:, row], before.conv[:, row])
    rec = not torch.equal(pool.recurrent[:, row], before.recurrent[:, row])
    return f"window {'changed' if conv else 'kept'}, state {'changed' if rec else 'kept'}"


def test_slot_rows_of_new_requests_are_zeroed_in_every_layer():
    # requests 0 and 2 start (all their tokens are new), request 1 continues at row 1
    pool, rows = _random_pool(), torch.tensor([4, 1, 2])
    reset_new_rows(pool, rows, [5, 3, 1], [5, 8, 1])
    for row in (4, 2):
        assert (pool.conv[:, row] == 0).all(), f"row {row}: a new request's window is not zero"
        assert (pool.recurrent[:, row] == 0).all(), f"row {row}: a new request's state is not zero"


def test_slot_row_of_a_continued_chunk_is_kept():
    # the second chunk of a prompt (3 new tokens of 8) and a request's first decode-like token:
    # both continue, their rows are their memory of the tokens before
    pool, rows = _random_pool(), torch.tensor([1, 3])
    before = _random_pool()
    reset_new_rows(pool, rows, [3, 1], [8, 6])
    for row in (1, 3):
        assert torch.equal(pool.conv[:, row], before.conv[:, row]) and torch.equal(
            pool.recurrent[:, row], before.recurrent[:, row]
        ), f"row {row} of a continued request: {_row_changes(pool, before, row)}"


def test_slot_rows_the_step_does_not_hold_are_kept():
    # rows 0, 3 and 5 belong to requests outside this step (decoding, or the scratch row)
    pool, rows = _random_pool(), torch.tensor([4, 1, 2])
    before = _random_pool()
    reset_new_rows(pool, rows, [5, 3, 1], [5, 8, 1])
    for row in (0, 3, 5):
        assert torch.equal(pool.conv[:, row], before.conv[:, row]) and torch.equal(
            pool.recurrent[:, row], before.recurrent[:, row]
        ), f"row {row}, no request of the step: {_row_changes(pool, before, row)}"


# more requests than rows (checked before any row is looked up); one of the two lists short
@pytest.mark.parametrize("news,totals", [([1, 1, 1], [1, 1, 1]), ([1, 2], [1]), ([1], [1, 2])])
def test_slot_reset_refuses_lengths_that_do_not_match_the_rows(news, totals):
    said = f"2 rows, {len(news)} new lengths and {len(totals)} total lengths: one of each"
    with refuses(
        ValueError, f"reset_new_rows(pool of 2 rows, rows [0, 1], {news}, {totals})", match=said
    ):
        reset_new_rows(_random_pool(), torch.tensor([0, 1]), news, totals)


def _raise_step_errors(outputs) -> None:
    """A step that raises ends its requests with an error reply (the engine goes on); raise it
    here again, so that an exercise not written yet reads as such."""
    for out in outputs:
        error = out.get("error")
        if error is None:
            continue
        stub = re.search(r"NotImplementedError: (ch26\.\w+: .*)", error)
        if stub:
            raise NotImplementedError(stub.group(1))
        pytest.fail(f"a step failed: {error}")


def test_a_tiny_qwen3_5_gives_transformers_tokens_in_chunks_with_reused_slots():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (30,), generator=g).tolist()
    prompts = [ids[:5], ids[5:18], ids]
    ckpt = hybrid_checkpoint("qwen3_5")
    want = hf_greedy(prompts, 4, model=ckpt)
    # fused_kernels off: on a GPU the engine's Triton recurrence would stand in for the learner's
    # delta_rule_chunked and causal_conv1d_step
    llm = build_llm(
        ckpt, cache_type="naive", page_size=2, max_extend_tokens=3, max_running_req=2,
        fused_kernels=False,
    )  # fmt: skip
    try:
        outputs = llm.generate(prompts, greedy(4))
    finally:
        llm.shutdown()
    _raise_step_errors(outputs)
    got = [o["token_ids"] for o in outputs]
    assert_tokens_equal(got, want, "Qwen3.5, chunks of 3 tokens, 2 slots for 3 requests")


def test_a_tiny_qwen3_5_gives_transformers_tokens_when_requests_take_turns_in_one_slot():
    """Overlap on and deferred CPU streams: each request's last step is still queued when the
    next one is scheduled into its slot; the new owner's first step must start from zeros, after
    that queued step, whatever it wrote."""
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False  # put back by conftest
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 256, (24,), generator=g).tolist()
    prompts = [ids[:6], ids[6:15], ids[3:24]]
    ckpt = hybrid_checkpoint("qwen3_5")
    want = hf_greedy(prompts, 4, model=ckpt)
    llm = build_llm(
        ckpt, device="cpu", cpu_streams="deferred", cache_type="naive", max_running_req=1
    )
    try:
        outputs = llm.generate(prompts, greedy(4))
    finally:
        llm.shutdown()
    _raise_step_errors(outputs)
    got = [o["token_ids"] for o in outputs]
    assert_tokens_equal(got, want, "Qwen3.5, 3 requests taking turns in 1 slot, deferred streams")
