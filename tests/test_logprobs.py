"""Logprobs in the offline engine: of each generated token (with its top-k alternatives) and of the
prompt's tokens (`prompt_logprobs`, what lm-eval's loglikelihood tasks need), compared with
transformers' log_softmax of its float32 logits on the same tokens."""

from __future__ import annotations

import pytest
import torch

from helpers import PROMPT_TEXTS, build_llm, hf_logits
from minisgl import SamplingParams

TOL = 1e-4


@pytest.fixture(scope="module")
def llm():
    engine = build_llm()
    yield engine
    engine.shutdown()


def _reference(ids):
    return torch.log_softmax(hf_logits(ids).float(), dim=-1)


def _check_prompt(out, prompt, k):
    ref = _reference(prompt)
    lp = out["prompt_logprobs"]
    assert len(lp) == len(prompt) and lp[0] is None
    for t in range(1, len(prompt)):
        e = lp[t]
        assert e["token_id"] == prompt[t]
        assert abs(e["logprob"] - ref[t - 1, prompt[t]].item()) < TOL, t
        top = ref[t - 1].topk(k)
        assert [i for i, _ in e["top_logprobs"]] == top.indices.tolist()
        diffs = [abs(a - b) for (_, a), b in zip(e["top_logprobs"], top.values.tolist())]
        assert max(diffs, default=0.0) < TOL


def test_generated_tokens_logprobs_match_hf(llm):
    prompt = llm.encode(PROMPT_TEXTS[0]).tolist()
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3)
    out = llm.generate(PROMPT_TEXTS[0], params)[0]
    full = prompt + out["token_ids"]
    ref = _reference(full)
    assert len(out["logprobs"]) == 6
    for j, e in enumerate(out["logprobs"]):
        pos = len(prompt) - 1 + j
        assert e["token_id"] == full[pos + 1]
        assert abs(e["logprob"] - ref[pos, full[pos + 1]].item()) < TOL
        assert [i for i, _ in e["top_logprobs"]] == ref[pos].topk(3).indices.tolist()
    assert "prompt_logprobs" not in out


def test_logprobs_are_of_the_raw_logits_not_the_tempered_ones(llm):
    prompt = llm.encode(PROMPT_TEXTS[1]).tolist()
    params = SamplingParams(temperature=0.5, max_tokens=1, logprobs=0, seed=1)
    out = llm.generate(PROMPT_TEXTS[1], params)[0]
    ref = _reference(prompt)
    e = out["logprobs"][0]
    assert e["top_logprobs"] == []
    assert abs(e["logprob"] - ref[-1, e["token_id"]].item()) < TOL


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_prompt_logprobs_match_hf_with_and_without_generation(llm, max_tokens):
    prompt = llm.encode(PROMPT_TEXTS[0]).tolist()
    before = (llm.table_manager.available_size, llm.cache_manager.available_pages)
    params = SamplingParams(max_tokens=max_tokens, prompt_logprobs=True, logprobs=2)
    out = llm.generate(PROMPT_TEXTS[0], params)[0]
    _check_prompt(out, prompt, 2)
    assert len(out["token_ids"]) == max_tokens
    assert (llm.table_manager.available_size, llm.cache_manager.available_pages) == before


def test_prompt_logprobs_of_a_cached_prefix_are_computed_again(llm):
    """The third test prompt shares a prefix with the first: once the first is cached, a plain
    request reuses it, and one asking for prompt logprobs must not (no logits there)."""
    llm.generate(PROMPT_TEXTS[0], SamplingParams(max_tokens=1))
    prompt = llm.encode(PROMPT_TEXTS[2]).tolist()
    out = llm.generate(PROMPT_TEXTS[2], SamplingParams(max_tokens=1, prompt_logprobs=True))[0]
    _check_prompt(out, prompt, 0)


@pytest.mark.parametrize("overlap", [False, True])
def test_prompt_logprobs_across_chunks_and_beside_other_requests(overlap):
    engine = build_llm(max_extend_tokens=5, overlap_scheduling=overlap)
    try:
        prompts = [engine.encode(t).tolist() for t in PROMPT_TEXTS]
        params = [
            SamplingParams(max_tokens=3, ignore_eos=True),
            SamplingParams(max_tokens=2, prompt_logprobs=True, logprobs=4, ignore_eos=True),
            SamplingParams(max_tokens=0, prompt_logprobs=True, logprobs=1),
            SamplingParams(max_tokens=4, ignore_eos=True, logprobs=1),
        ]
        out = engine.generate(prompts, params)
        _check_prompt(out[1], prompts[1], 4)
        _check_prompt(out[2], prompts[2], 1)
        assert "logprobs" not in out[0] and len(out[3]["logprobs"]) == 4
        plain = build_llm().generate(prompts[:1], SamplingParams(max_tokens=3, ignore_eos=True))
        assert out[0]["token_ids"] == plain[0]["token_ids"]  # the others are unaffected
        assert engine._prompt_parts == {}
    finally:
        engine.shutdown()


def test_a_one_token_prompt_has_one_null_prompt_logprob(llm):
    prompt = llm.encode(PROMPT_TEXTS[0]).tolist()[:1]
    out = llm.generate([prompt], SamplingParams(max_tokens=0, prompt_logprobs=True))[0]
    assert out["prompt_logprobs"] == [None] and out["token_ids"] == []


def test_bad_logprobs_settings_are_refused():
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
    with pytest.raises(TypeError, match="logprobs"):
        SamplingParams(logprobs=True)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_an_aborted_chunked_prefill_leaves_no_prompt_logprobs_behind():
    engine = build_llm(max_extend_tokens=4)
    try:
        params = SamplingParams(max_tokens=2, prompt_logprobs=True)
        uid = engine.add_request(PROMPT_TEXTS[0], params)
        engine.step()
        engine.step()  # a chunk or two handled: their logprobs wait for the last one
        engine.abort(uid)
        engine.run_until_idle()
        assert engine._prompt_parts == {}
        out = engine.generate(PROMPT_TEXTS[0], params)[0]  # the next one is whole again
        _check_prompt(out, engine.encode(PROMPT_TEXTS[0]).tolist(), 0)
    finally:
        engine.shutdown()
