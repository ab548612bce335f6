"""Stop strings, stop token ids and per-request seeds in the offline engine (issue 26: lm-eval's
local-completions always sends `stop` and `seed`). The server's side is in test_server_sampling.py.
"""

from __future__ import annotations

import pytest

from helpers import PROMPT_TEXTS, build_llm, greedy
from minisgl import SamplingParams
from minisgl.llm.stops import first_stop, held_back


@pytest.fixture(scope="module")
def llm():
    engine = build_llm()
    yield engine
    engine.shutdown()


def _free(llm):
    return llm.table_manager.available_size, llm.cache_manager.available_pages


# ---------------------------------------------------------------- text helpers


def test_first_stop_and_held_back():
    assert first_stop("abc STOP def END", ["END", "STOP"]) == 4
    assert first_stop("abc", ["x"]) is None
    assert held_back("hello wo", ["world"]) == 2  # "wo" may begin "world"
    assert held_back("hello", ["world"]) == 0
    assert held_back("ab", ["abc", "b!"]) == 2


# ---------------------------------------------------------------- stop strings


@pytest.mark.parametrize("overlap", [False, True])
def test_a_stop_string_cuts_the_text_and_finishes_in_the_scheduler(llm, overlap):
    llm.config.overlap_scheduling = overlap
    try:
        _stop_string_run(llm)
    finally:
        llm.config.overlap_scheduling = None


def _stop_string_run(llm):
    prompt = PROMPT_TEXTS[0]
    full = llm.generate(prompt, greedy(24))[0]
    # a stop string taken from the middle of the greedy continuation
    text = full["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    before = _free(llm)
    out = llm.generate(prompt, greedy(24, stop=[stop]))[0]
    assert out["text"] == text[: text.find(stop)]
    assert out["finish_reason"] == "stop"
    # the scheduler ended it: fewer tokens were generated than max_tokens
    assert len(out["token_ids"]) < len(full["token_ids"])
    assert out["token_ids"] == full["token_ids"][: len(out["token_ids"])]
    assert _free(llm) == before  # its slot and pages are back
    assert full["finish_reason"] == "length"


def test_a_stop_string_that_never_appears_changes_nothing(llm):
    full = llm.generate(PROMPT_TEXTS[1], greedy(12))[0]
    out = llm.generate(PROMPT_TEXTS[1], greedy(12, stop=["\u2603never"]))[0]
    assert out == full


def test_stop_strings_in_a_batch_stop_only_their_own_request(llm):
    prompts = PROMPT_TEXTS[:3]
    full = llm.generate(prompts, greedy(20))
    stop = full[1]["text"][5:8]
    params = [greedy(20), greedy(20, stop=stop), greedy(20)]
    out = llm.generate(prompts, params)
    assert out[0] == full[0] and out[2] == full[2]
    assert out[1]["text"] == full[1]["text"][: full[1]["text"].find(stop)]
    assert out[1]["finish_reason"] == "stop"


# ---------------------------------------------------------------- stop token ids


def test_a_stop_token_id_ends_like_eos_and_is_not_in_the_text(llm):
    full = llm.generate(PROMPT_TEXTS[0], greedy(16))[0]
    stop_id = full["token_ids"][6]
    k = full["token_ids"].index(stop_id)
    out = llm.generate(PROMPT_TEXTS[0], greedy(16, stop_token_ids=[stop_id]))[0]
    assert out["token_ids"] == full["token_ids"][: k + 1]
    assert out["text"] == llm.decode(full["token_ids"][:k])
    assert out["finish_reason"] == "stop"


def test_stop_token_ids_outside_the_vocabulary_are_refused(llm):
    with pytest.raises(ValueError, match="stop token id"):
        llm.generate("x", SamplingParams(stop_token_ids=[10**7]))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(stop=[3]), "stop"),
        (dict(stop=[""]), "empty"),
        (dict(stop_token_ids=[True]), "stop_token_ids"),
        (dict(stop_token_ids=[-2]), "stop_token_ids"),
        (dict(seed="7"), "seed"),
    ],
)
def test_bad_stops_and_seeds_are_refused_naming_the_field(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        SamplingParams(**kw)


# ---------------------------------------------------------------- seeds


def _sampled(seed=None, max_tokens=12):
    return SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=seed)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_seed_gives_the_same_tokens_alone_and_inside_any_batch(llm, overlap):
    llm.config.overlap_scheduling = overlap
    try:
        alone = llm.generate(PROMPT_TEXTS[0], _sampled(42))[0]["token_ids"]
        assert llm.generate(PROMPT_TEXTS[0], _sampled(42))[0]["token_ids"] == alone
        others = [_sampled(7), _sampled(None), _sampled(42), _sampled(None)]
        prompts = [PROMPT_TEXTS[1], PROMPT_TEXTS[3], PROMPT_TEXTS[0], PROMPT_TEXTS[2]]
        batch = llm.generate(prompts, others)
        assert batch[2]["token_ids"] == alone
        mixed = llm.generate([PROMPT_TEXTS[3], PROMPT_TEXTS[0]], [_sampled(), _sampled(42)])
        assert mixed[1]["token_ids"] == alone
        assert llm.generate(PROMPT_TEXTS[0], _sampled(43))[0]["token_ids"] != alone
    finally:
        llm.config.overlap_scheduling = None


def test_a_seed_gives_the_same_tokens_however_the_prompt_is_chunked():
    whole = build_llm()
    chunked = build_llm(max_extend_tokens=4)
    try:
        a = whole.generate(PROMPT_TEXTS[0], _sampled(5))[0]["token_ids"]
        b = chunked.generate([PROMPT_TEXTS[1], PROMPT_TEXTS[0]], [_sampled(), _sampled(5)])
        assert b[1]["token_ids"] == a
    finally:
        whole.shutdown()
        chunked.shutdown()


def test_unseeded_requests_keep_the_engines_generator(llm):
    """No seed: the batched draw from the engine's generator, as before (a fresh engine with the
    same engine seed repeats the run)."""
    first = build_llm(seed=3)
    second = build_llm(seed=3)
    try:
        a = first.generate(PROMPT_TEXTS[:2], _sampled())
        b = second.generate(PROMPT_TEXTS[:2], _sampled())
        assert [o["token_ids"] for o in a] == [o["token_ids"] for o in b]
    finally:
        first.shutdown()
        second.shutdown()
