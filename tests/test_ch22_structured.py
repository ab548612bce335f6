"""Chapter 22: structured output. The judge's tests of its three exercises, in the chapter's words.

- `sample_with_bitmask` (minisgl/structured/bitmask.py): the mask on the raw logits, before
  temperature, top-k and top-p; only the constrained requests' rows, found through the prompt
  logprobs' row plan.
- `_handle_with_matchers` (minisgl/scheduler/grammar_steps.py): each matcher takes exactly the
  tokens its request receives, a refused token is recorded, and a matcher lives as long as its
  request, an aborted one's too.
- `_handle_step` (same file): step N handled before step N+1's mask is filled (overlap), the
  normal loop's own step sampled before it is handled.

The engine runs use deferred CPU streams (chapter 11): the engine runs behind the scheduler every
time, so a mask filled from matchers that have not taken step N's token yet shows on a laptop, as
invalid JSON.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from helpers import PROMPT_TEXTS, cpu_streams_llm, greedy
from minisgl import SamplingParams
from minisgl.engine.request_sampling import LogprobPlan, RequestSampler
from minisgl.engine.sampler import BatchSamplingArgs, Sampler
from minisgl.structured.bitmask import sample_with_bitmask
from structured_cases import SCHEMAS

V = 64  # columns of the hand-made logits: two int32 words of bitmask


def _bitmask(*allowed_rows):
    """[C, 2] int32: row i allows the tokens of allowed_rows[i]."""
    mask = torch.zeros(len(allowed_rows), V // 32, dtype=torch.int32)
    for i, allowed in enumerate(allowed_rows):
        for t in allowed:
            word = int(mask[i, t // 32]) | (1 << (t % 32))
            mask[i, t // 32] = word - (1 << 32) if word >= 1 << 31 else word  # int32 wraps
    return mask


def _logits(rows: int) -> torch.Tensor:
    """Row r prefers token V-1, then V-2, ...: the most likely tokens are the highest ids."""
    return torch.linspace(0.0, 12.0, V).repeat(rows, 1)


def _sampled_args(rows, temperature=1.0, top_k=-1, top_p=1.0):
    return BatchSamplingArgs.from_params(
        [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * rows,
        V,
        torch.device("cpu"),
    )


# ------------------------------------------------------------------ ch22.sample_with_bitmask


def test_a_greedy_constrained_row_takes_the_argmax_over_its_allowed_tokens():
    logits = _logits(2)
    allowed = [3, 17, 40]  # token 63, every row's argmax, is forbidden
    args = BatchSamplingArgs(None, None, None)
    tokens = sample_with_bitmask(
        Sampler(torch.device("cpu"), 0), logits, args, torch.tensor([1]), _bitmask(allowed)
    )
    assert tokens.dtype == torch.int32, f"tokens are {tokens.dtype}, expected torch.int32"
    assert int(tokens[1]) == 40, (
        f"a greedy constrained row took token {int(tokens[1])}: the argmax over its allowed "
        f"tokens {allowed} is 40"
    )
    assert int(tokens[0]) == V - 1, (
        f"the free row next to it took {int(tokens[0])}, not its own argmax {V - 1}: only the "
        "constrained requests' rows are masked"
    )


@pytest.mark.parametrize(
    "top_k, top_p", [(3, 1.0), (-1, 0.5), (3, 0.5)], ids=["top_k", "top_p", "both"]
)
def test_the_mask_comes_before_temperature_top_k_and_top_p(top_k, top_p):
    """The k most likely tokens (61, 62, 63) and the nucleus are all forbidden: masked first, the
    draw is among the allowed tokens; cut first, nothing allowed would be left to draw."""
    allowed = [2, 5, 30, 33, 50]
    args = _sampled_args(4, temperature=0.7, top_k=top_k, top_p=top_p)
    logits = _logits(4)
    try:
        tokens = sample_with_bitmask(
            Sampler(torch.device("cpu"), 1),
            logits,
            args,
            torch.tensor([0, 1, 2, 3]),
            _bitmask(*[allowed] * 4),
        )
    except RuntimeError as e:
        pytest.fail(
            f"top-k {top_k}, top-p {top_p} over a row whose most likely tokens are all forbidden "
            f"left nothing to draw ({e}): the mask comes before temperature, top-k and top-p"
        )
    drawn = tokens.tolist()
    assert all(t in allowed for t in drawn), (
        f"a constrained row drew {drawn}, outside its allowed tokens {allowed}: the mask comes "
        "before temperature, top-k and top-p"
    )
    if top_k == 3:  # top-k over the allowed tokens: the 3 most likely of them
        assert all(t in (30, 33, 50) for t in drawn), (
            f"top-k 3 drew {drawn}: after the mask, the 3 most likely allowed tokens are "
            "30, 33 and 50"
        )


def test_a_free_row_keeps_its_logits_and_its_draws():
    allowed = [1, 2]
    logits = _logits(3) + torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    free = Sampler(torch.device("cpu"), 7).sample(logits.clone(), _sampled_args(3))
    got = sample_with_bitmask(
        Sampler(torch.device("cpu"), 7),
        logits,
        _sampled_args(3),
        torch.tensor([2]),
        _bitmask(allowed),
    )
    for row in (0, 1):
        assert torch.equal(logits[row], before[row]), (
            f"row {row}, a free request, had its logits changed: only the constrained requests' "
            "rows are masked"
        )
    assert got[:2].tolist() == free[:2].tolist(), (
        f"the free rows drew {got[:2].tolist()} next to a constrained row, {free[:2].tolist()} "
        "without it: a free request draws what it would draw alone"
    )
    assert int(got[2]) in allowed, f"the constrained row drew {int(got[2])}, not in {allowed}"


def test_with_token_logprobs_only_request_i_samples_from_row_i():
    """A plan without sample_rows (only sampled tokens' logprobs asked for): row i is request i."""
    logits = _logits(2)
    args = BatchSamplingArgs(None, None, None, logprob_plan=LogprobPlan(k=0))
    tokens = sample_with_bitmask(
        Sampler(torch.device("cpu"), 0), logits, args, torch.tensor([1]), _bitmask([9])
    )
    assert tokens.tolist() == [V - 1, 9], (
        f"tokens {tokens.tolist()}, expected [{V - 1}, 9]: a logprob plan without sample_rows "
        "(no prompt logprobs) leaves request i on logits row i"
    )


def test_with_prompt_logprobs_the_mask_lands_on_the_requests_sampling_row():
    """Request 0 asked for its prompt's logprobs: its 3 prompt positions have logits rows 0-2 and
    it samples from row 2; request 1 (constrained) samples from row 3."""
    logits = _logits(4)
    plan = LogprobPlan(k=0, sample_rows=torch.tensor([2, 3]))
    args = BatchSamplingArgs(None, None, None, logprob_plan=plan)
    tokens = sample_with_bitmask(
        RequestSampler(torch.device("cpu"), 0), logits, args, torch.tensor([1]), _bitmask([9])
    )
    assert int(tokens[1]) == 9, (
        f"request 1 took {int(tokens[1])}, not its only allowed token 9: with prompt logprobs "
        "the logits have more rows than requests, and request i samples from "
        "logprob_plan.sample_rows[i]"
    )
    assert torch.isfinite(logits[1]).all(), (
        "logits row 1 (a prompt position of request 0) was masked: the constrained request's "
        "row is logprob_plan.sample_rows[1] = 3"
    )


# ------------------------------------------------------------------ engine runs

SCHEMA_CASES = ["nested_object", "array_of_objects", "flat_person", "pattern_id", "enum_only"]


def _check_json(name: str, out: dict) -> None:
    text = out["text"]
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        pytest.fail(
            f"schema {name}: the output is not JSON ({e}): {text!r}. A matcher takes exactly its "
            "request's tokens (no chunk's), and step N+1's mask is filled only after step N's "
            "tokens reached the matchers"
        )
    try:
        jsonschema.validate(parsed, SCHEMAS[name])
    except jsonschema.ValidationError as e:
        pytest.fail(f"schema {name}: {text!r} does not follow the schema: {e.message}")
    assert out["finish_reason"] == "stop", (
        f"schema {name}: finish_reason {out['finish_reason']!r}, expected 'stop': a request whose "
        "grammar has ended finishes at its EOS"
    )


def _watch_rejects(llm):
    rejects = []
    llm.events.subscribe(
        lambda ev: rejects.append(dict(ev.fields)) if ev.kind == "grammar_reject" else None
    )
    return rejects


def _run(overlap: bool, **options):
    """Five constrained requests and two free ones, deferred CPU streams."""
    llm = cpu_streams_llm("deferred", overlap_scheduling=overlap, **options)
    try:
        rejects = _watch_rejects(llm)
        prompts = [PROMPT_TEXTS[i % len(PROMPT_TEXTS)] for i in range(len(SCHEMA_CASES))]
        params = [
            SamplingParams(max_tokens=64, constraint={"json_schema": SCHEMAS[n]})
            for n in SCHEMA_CASES
        ]
        outs = llm.generate(prompts + PROMPT_TEXTS[:2], params + [greedy(10)] * 2)
        return outs, rejects, dict(llm._matchers)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def free_alone():
    llm = cpu_streams_llm("deferred")
    try:
        return [o["token_ids"] for o in llm.generate(PROMPT_TEXTS[:2], greedy(10))]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_every_constrained_output_validates_and_no_matcher_refuses_a_token(overlap, free_alone):
    """Two slots for seven requests (constrained ones wait in the queue), chunks of 8 tokens,
    pages of 4, deferred CPU streams."""
    outs, rejects, left = _run(overlap, max_running_req=2, max_extend_tokens=8, page_size=4)
    for name, out in zip(SCHEMA_CASES, outs):
        _check_json(name, out)
    assert not rejects, (
        f"a matcher refused a token its own mask allowed ({rejects[0]}): it must take exactly "
        "its request's tokens, in order (the step's tokens once copy_done is waited for; "
        "nothing for a chunk or a request in finished_reqs)"
    )
    for out, want in zip(outs[len(SCHEMA_CASES) :], free_alone):
        assert out["token_ids"] == want, (
            f"a free request's tokens changed next to constrained ones: {out['token_ids']}, "
            f"alone {want}"
        )
    assert left == {}, f"matchers left after every request ended: {sorted(left)}"


def test_the_overlap_loop_gives_the_normal_loops_constrained_tokens():
    overlap, _, _ = _run(True)
    normal, _, _ = _run(False)
    for name, a, b in zip(SCHEMA_CASES, overlap, normal):
        assert a["token_ids"] == b["token_ids"], (
            f"schema {name}: the overlap loop gave {a['token_ids']}, the normal loop "
            f"{b['token_ids']}: step N+1's mask must be filled after step N is handled"
        )


def test_step_n_plus_1s_mask_is_filled_after_step_n_is_handled():
    """The order of a turn under overlap: launch step N+1's forward, handle step N (each matcher
    takes its token), fill step N+1's mask, launch its sampling. Filled before the handling, the
    mask is the one of a step ago: with deferred CPU streams the output is invalid JSON."""
    outs, rejects, _ = _run(True)
    for name, out in zip(SCHEMA_CASES, outs):
        _check_json(name, out)
    assert not rejects, f"a matcher refused a token its request's mask allowed: {rejects[0]}"


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_an_aborted_request_loses_its_matcher_and_a_queued_one_keeps_its_own(overlap):
    llm = cpu_streams_llm("deferred", overlap_scheduling=overlap, max_running_req=1)
    try:
        schema = {"json_schema": SCHEMAS["nested_object"]}
        first = llm.add_request(PROMPT_TEXTS[0], SamplingParams(max_tokens=64, constraint=schema))
        params = SamplingParams(max_tokens=64, constraint=schema)
        queued = llm.add_request(PROMPT_TEXTS[1], params)
        for _ in range(3):
            llm.step()
        assert first in llm._matchers, "the running constrained request has no matcher"
        assert queued in llm._matchers, (
            "the constrained request waiting in the queue lost its matcher: a matcher lives as "
            "long as its request, queued ones included"
        )
        llm.abort(first)
        llm.run_until_idle()
        assert llm._matchers == {}, (
            f"matchers left once every request ended ({sorted(llm._matchers)}; request {first} "
            "was aborted): an aborted request's matcher is dropped too"
        )
        _check_json("nested_object", llm._output(llm.results[queued], params))
    finally:
        llm.shutdown()


class _StandIn(SimpleNamespace):
    __hash__ = object.__hash__


def test_a_refused_token_is_recorded_as_a_grammar_reject_event():
    llm = cpu_streams_llm("deferred", overlap_scheduling=False)
    try:
        rejects = _watch_rejects(llm)
        uid = llm.add_request(
            PROMPT_TEXTS[0], SamplingParams(max_tokens=8, constraint={"regex": "a+"})
        )
        llm.step()  # the prefill is handled: the matcher now waits for more "a"
        req = _StandIn(uid=uid, is_chunk=False)  # hashable: it is looked up in finished_reqs
        token = llm.encode("b").tolist()[-1]
        done = SimpleNamespace(synchronize=lambda: None)
        step = SimpleNamespace(batch=SimpleNamespace(reqs=[req]))
        out = SimpleNamespace(copy_done=done, next_tokens_cpu=torch.tensor([token]))
        handled = []
        llm._handle_with_matchers((step, out), handled.append)
        assert handled == [(step, out)], "the step was not handed to the base handling"
        assert [(r["uid"], r["token"]) for r in rejects] == [(uid, token)], (
            f"a token the matcher refused gave the events {rejects}: one grammar_reject naming "
            f"the uid {uid} and the token {token}"
        )
        assert rejects[0]["error"], "the grammar_reject event carries the matcher's error"
    finally:
        llm.shutdown()


def test_a_request_in_finished_reqs_feeds_its_matcher_nothing():
    """The handling drops the token of a request in finished_reqs (chapter 11's rules 2 and 4), so
    its matcher must not take it either. Retraction (minisgl/scheduler/retract.py) takes a running
    request out while its token is in flight and requeues it under the same uid, matcher and all:
    a matcher that took the dropped token is one token ahead when the request resumes."""
    llm = cpu_streams_llm("deferred", overlap_scheduling=False)
    try:
        rejects = _watch_rejects(llm)
        uid = llm.add_request(
            PROMPT_TEXTS[0], SamplingParams(max_tokens=8, constraint={"regex": "a+"})
        )
        llm.step()  # the prefill is handled: the matcher now waits for more "a"
        req = _StandIn(uid=uid, is_chunk=False)
        llm.finished_reqs.add(req)  # as a retraction or an abort leaves it
        token = llm.encode("b").tolist()[-1]  # refused by "a+": taken, it would be an event
        done = SimpleNamespace(synchronize=lambda: None)
        step = SimpleNamespace(batch=SimpleNamespace(reqs=[req]))
        out = SimpleNamespace(copy_done=done, next_tokens_cpu=torch.tensor([token]))

        def handle(data):  # as chapter 11's: finished_reqs becomes this step's ended (none here)
            llm.finished_reqs = set()

        llm._handle_with_matchers((step, out), handle)
        taken = [r["token"] for r in rejects]
        assert not taken, (
            f"the matcher of request {uid}, which is in finished_reqs, took the step's token "
            f"{taken[0]} (a grammar_reject event): the handling drops that token, so no matcher "
            "may take it (and the matchers are fed before `handle`, which replaces finished_reqs)"
        )
    finally:
        llm.shutdown()
