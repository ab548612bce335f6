"""Chapter 1: the core data. A request's length arithmetic through prefill and decode, sampling
parameters, and the per-forward Context."""

from __future__ import annotations

import pytest
import torch

from minisgl.core import Batch, Context, Req, SamplingParams
from refusals import refuses


def make_req(prompt_len: int = 5, max_tokens: int = 3, cached_len: int = 0) -> Req:
    ids = torch.arange(10, 10 + prompt_len, dtype=torch.int32)
    return Req(
        input_ids=ids,
        table_idx=0,
        cached_len=cached_len,
        output_len=max_tokens,
        uid=7,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )


# ---------------------------------------------------------------- Req


def test_new_request_lengths():
    req = make_req(prompt_len=5, max_tokens=3)
    assert (req.cached_len, req.device_len, req.max_device_len) == (0, 5, 8)
    assert req.remain_len == 3


@pytest.mark.parametrize("cached_len,expected", [(0, 5), (3, 2), (4, 1), (5, 0)])
def test_extend_len_counts_the_uncached_tokens(cached_len, expected):
    # A prefix-cache hit of `cached_len` tokens leaves only the rest for the model to run. With
    # every token cached (a prefill chunk just completed) nothing is left: 0, not 1, or the batch's
    # token count and the chunk's budget count a token that no pass runs.
    req = make_req(prompt_len=5, cached_len=cached_len)
    assert req.extend_len == expected, (
        f"5-token prompt with {cached_len} cached: extend_len should be {expected}, got "
        f"{req.extend_len}"
    )


def test_extend_len_follows_device_len():
    req = make_req(prompt_len=5)
    req.cached_len, req.device_len = 6, 7
    assert req.extend_len == 1, (
        "cached_len 6, device_len 7 (input_ids still 5 long): extend_len should be 1, got "
        f"{req.extend_len}"
    )


def test_complete_one_moves_everything_into_the_cache_and_adds_one_token():
    req = make_req(prompt_len=5, max_tokens=3, cached_len=2)
    req.complete_one()
    got = (req.cached_len, req.device_len)
    assert got == (5, 6), (
        f"after one complete_one, (cached_len, device_len) should be (5, 6), got {got}"
    )
    req.complete_one()
    got = (req.cached_len, req.device_len)
    assert got == (6, 7), (
        f"after two complete_one, (cached_len, device_len) should be (6, 7), got {got}"
    )
    assert req.max_device_len == 8, f"max_device_len must never move: 8, got {req.max_device_len}"


@pytest.mark.parametrize("device_len,expected", [(5, True), (7, True), (8, False)])
def test_can_decode_until_max_tokens(device_len, expected):
    req = make_req(prompt_len=5, max_tokens=3)
    req.device_len = device_len
    assert req.can_decode is expected, (
        f"device_len {device_len} of max_device_len 8: can_decode should be {expected}, got "
        f"{req.can_decode}"
    )


def test_lengths_through_prefill_and_decode():
    """The life of a request with a 5-token prompt and max_tokens=3: one prefill, two decodes."""
    req = make_req(prompt_len=5, max_tokens=3)

    def lengths():
        return dict(
            cached_len=req.cached_len,
            device_len=req.device_len,
            extend_len=req.extend_len,
            remain_len=req.remain_len,
            can_decode=req.can_decode,
        )

    def check(when, **want):
        got = {k: v for k, v in lengths().items() if k in want}
        assert got == want, f"{when}: expected {want}, got {got}"

    check("a new request", extend_len=5, can_decode=True)
    req.complete_one()  # prefill launched: the prompt is cached, token 6 is being sampled
    check(
        "after the prefill's complete_one",
        cached_len=5,
        device_len=6,
        extend_len=1,
        remain_len=2,
        can_decode=True,
    )
    req.append_host(torch.tensor([42]))
    req.complete_one()  # decode 1
    check(
        "after decode 1's complete_one",
        cached_len=6,
        device_len=7,
        extend_len=1,
        remain_len=1,
        can_decode=True,
    )
    req.append_host(torch.tensor([43]))
    req.complete_one()  # decode 2: the last token the request may produce is being sampled
    check(
        "after decode 2's complete_one (max_tokens reached)",
        cached_len=7,
        device_len=8,
        remain_len=0,
        can_decode=False,
    )
    req.append_host(torch.tensor([44]))
    ids = req.input_ids.tolist()
    assert ids == [10, 11, 12, 13, 14, 42, 43, 44], (
        f"input_ids should be the prompt and 3 tokens, got {ids}"
    )


def test_append_host_keeps_int32_and_does_not_touch_lengths():
    req = make_req(prompt_len=3)
    req.append_host(torch.tensor([5], dtype=torch.int64))
    assert req.input_ids.dtype == torch.int32
    assert req.input_ids.tolist() == [10, 11, 12, 5]
    assert (req.cached_len, req.device_len) == (0, 3)  # the device side moves only in complete_one


def test_requests_compare_by_identity():
    a, b = make_req(), make_req()
    assert a != b and len({a, b}) == 2


# ---------------------------------------------------------------- SamplingParams


@pytest.mark.parametrize(
    "kwargs,greedy",
    [
        (dict(), True),  # the default is greedy
        (dict(temperature=0.0, top_k=50), True),
        (dict(temperature=0.8, top_k=1), True),  # only one candidate: nothing to sample
        (dict(temperature=0.8), False),
        (dict(temperature=0.8, top_k=2, top_p=0.5), False),
        (dict(temperature=1e-3), False),
        (dict(temperature=1e-6), False),  # any positive temperature samples, however sharp
        (dict(temperature=0.0, top_p=0.5), True),  # top_p plays no part: top-p keeps the argmax
        (dict(temperature=0.8, top_k=1, top_p=0.3), True),
    ],
)
def test_greedy_detection(kwargs, greedy):
    got = SamplingParams(**kwargs).is_greedy
    assert got is greedy, (
        f"SamplingParams({', '.join(f'{k}={v}' for k, v in kwargs.items())}).is_greedy "
        f"should be {greedy}, got {got!r}"
    )


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.2), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=-2), "top_k"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, field):
    with refuses(ValueError, f"SamplingParams(**{kwargs})", match=field):
        SamplingParams(**kwargs)


def test_sampling_params_accept_edge_values():
    SamplingParams(max_tokens=1, temperature=0.0, top_p=1.0, top_k=-1)
    SamplingParams(top_p=1e-6, top_k=1)


# ---------------------------------------------------------------- Batch and Context


def test_batch_phase_and_size():
    reqs = [make_req(), make_req()]
    assert Batch(reqs, "prefill").is_prefill and Batch(reqs, "prefill").size == 2
    assert Batch(reqs[:1], "decode").is_decode and not Batch(reqs[:1], "decode").is_prefill


def test_context_batch_exists_only_inside_forward_batch():
    ctx = Context(page_size=1)
    batch = Batch([make_req()], "prefill")
    with refuses(RuntimeError, "ctx.batch before any forward_batch", match="no batch"):
        ctx.batch
    with ctx.forward_batch(batch) as b:
        assert b is batch and ctx.batch is batch
    with refuses(RuntimeError, "ctx.batch after forward_batch ended", match="no batch"):
        ctx.batch


def test_context_refuses_nested_forward():
    ctx = Context(page_size=1)
    batch = Batch([make_req()], "decode")
    with ctx.forward_batch(batch):
        with refuses(RuntimeError, "forward_batch inside another", match="already running"):
            with ctx.forward_batch(Batch([make_req()], "decode")):
                pass
        assert ctx.batch is batch  # the refused attempt left the running batch alone


def test_context_is_cleared_after_an_exception():
    ctx = Context(page_size=1)
    with refuses(ZeroDivisionError, "forward_batch whose body divides by zero"):
        with ctx.forward_batch(Batch([make_req()], "prefill")):
            1 / 0
    with refuses(RuntimeError, "ctx.batch after a forward_batch that raised", match="no batch"):
        ctx.batch
    with ctx.forward_batch(Batch([make_req()], "decode")):  # usable again
        assert ctx.batch.is_decode
