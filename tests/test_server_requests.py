"""What a request to `python -m minisgl serve` may hold (one live server for the module): strict
JSON types, null as the default, unknown and unhonoured fields refused by name, never ignored;
list prompts and `n` as several choices, each with its index, equal to the offline engine's
outputs; response ids unique; the context-length refusal's OpenAI code."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from helpers import MODEL, PROMPT_TEXTS, assert_tokens_equal, build_llm
from minisgl import SamplingParams
from server_fixtures import (
    assert_all_back,
    idle,
    scheduler_stats,
    wait_for,
)

NAME = MODEL.name
CHAT = [{"role": "user", "content": "Who is there?"}]


@pytest.fixture(scope="module")
def llm():
    return build_llm()


def post(server, path, body):
    return httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)


def error_of(r, status=400):
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:300]}"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, f"not an OpenAI error: {error}"
    return error


# ------------------------------------------------------------------ strict types, nothing ignored

WRONG_TYPES = [  # (field, value): JSON of another type than the API's, never coerced
    ("max_tokens", "5"),
    ("max_tokens", True),
    ("max_tokens", 5.0),
    ("stream", "yes"),
    ("stream", 1),
    ("temperature", "0"),
    ("top_k", "1"),
    ("ignore_eos", "true"),
    ("prompt", 5),
    ("prompt", [1, "a"]),
    ("prompt", [True]),
]


@pytest.mark.parametrize("field,value", WRONG_TYPES, ids=[f"{f}={v!r}" for f, v in WRONG_TYPES])
def test_a_value_of_the_wrong_json_type_is_refused_naming_its_field(server, field, value):
    body = {"model": NAME, "prompt": "hi", "max_tokens": 2, field: value}
    error = error_of(post(server, "completions", body))
    assert error["param"] == field and field in error["message"], (
        f"{field}={value!r} should be refused naming {field!r}, got {error}"
    )


def test_an_int_is_a_json_number_for_a_float_field(server):
    r = post(server, "completions", {"model": NAME, "prompt": "hi", "max_tokens": 2, "top_p": 1})
    assert r.status_code == 200, f"top_p: 1 is a number, got {r.status_code}: {r.text[:200]}"


UNKNOWN = [
    ("completions", {"min_p": 0.1}, "min_p"),
    ("completions", {"repetition_penalty": 1.1}, "repetition_penalty"),
    ("completions", {"stream_options": {"include_usage": True, "extra": 1}}, "stream_options"),
    ("chat/completions", {"temprature": 0}, "temprature"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi", "x": 1}]}, "messages"),
]


@pytest.mark.parametrize("path,extra,name", UNKNOWN, ids=[u[2] for u in UNKNOWN])
def test_an_unknown_field_is_unrecognized_as_the_openai_api_says(server, path, extra, name):
    base = {"model": NAME, "max_tokens": 2}
    base.update({"prompt": "hi"} if path == "completions" else {"messages": CHAT})
    error = error_of(post(server, path, {**base, **extra}))
    assert "Unrecognized request argument supplied" in error["message"], error
    assert error["param"].startswith(name), f"the error should name {name!r}: {error}"


UNHONOURED = [  # OpenAI fields the server knows but cannot honour: refused by name
    ("completions", {"logit_bias": {"50": 10}}, "logit_bias"),
    ("completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": -1}, "frequency_penalty"),
    ("completions", {"suffix": "end"}, "suffix"),
    ("completions", {"best_of": 2}, "best_of"),
    ("chat/completions", {"tool_choice": "auto"}, "tool_choice"),  # no tools (structured.py)
    ("chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("chat/completions", {"store": True}, "store"),
    ("chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat/completions", {"reasoning_effort": "low"}, "reasoning_effort"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
        "messages[0].name",
    ),
]


@pytest.mark.parametrize("path,extra,name", UNHONOURED, ids=[u[2] for u in UNHONOURED])
def test_a_field_the_server_cannot_honour_is_refused_by_name(server, path, extra, name):
    base = {"model": NAME, "max_tokens": 2}
    base.update({"prompt": "hi"} if path == "completions" else {"messages": CHAT})
    error = error_of(post(server, path, {**base, **extra}))
    assert error["param"] == name and name in error["message"], (
        f"{extra} should be refused naming {name!r}, got {error}"
    )


def test_nulls_and_values_that_change_nothing_are_accepted_and_change_nothing(server):
    """Every field the OpenAI API lets be null, null; the no-op values of the unhonoured ones; the
    labels (`user`, `metadata`): the answer is the plain request's."""
    plain = {"model": NAME, "messages": CHAT, "max_tokens": 6, "temperature": 0}
    extras = {
        "top_p": None,
        "n": None,
        "stream": None,
        "stream_options": None,
        "stop": None,
        "seed": None,
        "presence_penalty": 0,
        "frequency_penalty": None,
        "logprobs": None,
        "top_logprobs": None,
        "logit_bias": {},
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "user": "alice",
        "metadata": {"team": "a"},
        "service_tier": "auto",
        "store": False,
        "max_completion_tokens": None,
    }
    want = post(server, "chat/completions", plain).json()
    got = post(server, "chat/completions", {**plain, **extras})
    assert got.status_code == 200, f"null and no-op values should be accepted: {got.text[:300]}"
    assert got.json()["choices"] == want["choices"], "they should change nothing"
    # an assistant message as the openai client sends it back (its null fields included)
    echoed = {"role": "assistant", "content": "Hi.", "refusal": None, "tool_calls": None}
    r = post(server, "chat/completions", {**plain, "messages": [*CHAT, echoed, *CHAT]})
    assert r.status_code == 200, f"a received message sent back should be accepted: {r.text}"


def test_null_temperature_takes_the_model_default_not_zero(server):
    """null is "not sent": the scheduler gives it the model's default, exactly as leaving it out."""
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 4, "ignore_eos": True}
    r = post(server, "completions", {**body, "temperature": None, "top_k": None, "top_p": None})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


# ------------------------------------------------------------------ several choices


def test_a_list_of_prompts_gets_one_choice_each_equal_to_offline(client, llm):
    prompts = PROMPT_TEXTS[:3]
    want = llm.generate(prompts, SamplingParams(max_tokens=8))
    r = client.completions.create(
        model=NAME,
        prompt=prompts,
        max_tokens=8,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2], f"one choice per prompt, got {r.choices}"
    assert_tokens_equal(
        [c.model_extra["token_ids"] for c in r.choices],
        [w["token_ids"] for w in want],
        "list prompt vs LLM.generate",
    )
    prompt_tokens = sum(len(llm.tokenizer.encode(p).ids) for p in prompts)
    assert r.usage.prompt_tokens == prompt_tokens, f"usage sums the prompts: {r.usage}"
    assert r.usage.completion_tokens == sum(len(w["token_ids"]) for w in want), r.usage


def test_a_list_of_token_id_lists_gets_one_choice_each(client, llm):
    ids = [llm.tokenizer.encode(p).ids for p in PROMPT_TEXTS[:2]]
    want = llm.generate(ids, SamplingParams(max_tokens=5))
    r = client.completions.create(
        model=NAME, prompt=ids, max_tokens=5, temperature=0, extra_body={"return_token_ids": True}
    )
    assert [c.model_extra["token_ids"] for c in r.choices] == [w["token_ids"] for w in want]
    assert r.usage.prompt_tokens == sum(len(i) for i in ids)


def test_a_streamed_list_of_prompts_carries_each_choice_index(client, llm):
    prompts = PROMPT_TEXTS[:2]
    want = llm.generate(prompts, SamplingParams(max_tokens=6))
    stream = client.completions.create(
        model=NAME,
        prompt=prompts,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, reasons, usage, ids = ["", ""], [None, None], None, set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.text
            reasons[c.index] = c.finish_reason or reasons[c.index]
    assert texts == [w["text"] for w in want], f"each index's text should be its prompt's: {texts}"
    assert all(reasons), f"each choice should finish: {reasons}"
    assert len(ids) == 1, f"one response id for the whole stream, got {ids}"
    assert usage.completion_tokens == sum(len(w["token_ids"]) for w in want), usage


def test_n_samples_of_one_prompt(client, llm):
    """Greedy, so the n samples are equal; each is a request of its own, and the prompt counts
    once in the usage."""
    want = llm.generate([PROMPT_TEXTS[0]], SamplingParams(max_tokens=5))[0]
    r = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=5, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2], r.choices
    assert len({c.message.content for c in r.choices}) == 1, "greedy samples should be equal"
    one = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=5, temperature=0)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens, "the prompt counts once"
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    two = client.completions.create(
        model=NAME, prompt=PROMPT_TEXTS[:2], max_tokens=5, temperature=0, n=2
    )
    texts = [c.text for c in two.choices]
    assert texts[0] == texts[1] == want["text"] and texts[2] == texts[3] != texts[0], (
        f"index prompt * n + sample, as the OpenAI API numbers them: {texts}"
    )


def test_a_one_element_prompt_list_as_langchain_sends_it(server):
    """LangChain's `OpenAI` (completions) sends this body: the prompt as a one-element list, and
    its unset options as null."""
    body = {
        "model": NAME,
        "prompt": ["ROMEO:"],
        "temperature": 0.7,
        "top_p": 1,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "n": 1,
        "seed": None,
        "logprobs": None,
        "max_tokens": 4,
    }
    r = post(server, "completions", body)
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0]


def test_one_refused_prompt_refuses_the_request_and_leaves_nothing_behind(server):
    body = {"model": NAME, "prompt": ["ROMEO:", "hi " * 300], "max_tokens": 4}
    error = error_of(post(server, "completions", body))
    assert error["code"] == "context_length_exceeded", error
    stats = wait_for("the scheduler going idle", lambda: scheduler_stats(server.url), idle)
    assert_all_back(stats)


def test_a_client_leaving_a_stream_of_several_choices_aborts_them_all(server, client):
    before = scheduler_stats(server.url)
    stream = client.completions.create(
        model=NAME,
        prompt=PROMPT_TEXTS[:2],
        n=2,
        max_tokens=200,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    stream.close()

    def aborts(s):
        return sum(v for k, v in s.items() if k.startswith("abort_"))

    stats = wait_for(
        "the scheduler going idle", lambda: scheduler_stats(server.url), idle, timeout=60
    )
    assert aborts(stats) - aborts(before) == 4, "4 choices were running: expected 4 aborts"
    assert_all_back(stats)


def test_an_empty_prompt_in_a_list_is_refused(server):
    error = error_of(post(server, "completions", {"model": NAME, "prompt": [[5, 6], []]}))
    assert error["param"] == "prompt", error
    # an empty text is the tokenizer's to judge (this one adds no BOS: no tokens, refused)
    error = error_of(post(server, "completions", {"model": NAME, "prompt": ["hi", ""]}))
    assert "empty" in error["message"], error


# ------------------------------------------------------------------ ids, codes


def test_response_ids_are_unique(server):
    body = {"model": NAME, "prompt": "hi", "max_tokens": 1}
    ids = {post(server, "completions", body).json()["id"] for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith("cmpl-") and len(i) > 20 for i in ids), ids


def test_a_prompt_too_long_has_the_openai_code(server):
    body = {"model": NAME, "messages": CHAT, "max_tokens": 300}
    error = error_of(post(server, "chat/completions", body))
    assert error["code"] == "context_length_exceeded", error
    assert "context length" in error["message"], error
    with pytest.raises(openai.BadRequestError) as e:
        openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).completions.create(
            model=NAME, prompt="hi " * 300, max_tokens=1
        )
    assert e.value.code == "context_length_exceeded"


def test_the_streamed_usage_chunk_is_one_json_event(server):
    body = {"model": NAME, "prompt": ["a", "b"], "max_tokens": 2, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        events = "".join(r.iter_text())[:-2].split("\n\n")
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1, events
    usage = [json.loads(e[6:]) for e in events[:-1] if '"usage"' in e]
    assert len(usage) == 1 and usage[0]["choices"] == [], f"one usage chunk: {usage}"


def test_a_client_leaving_a_plain_request_of_several_choices_aborts_them_all(server):
    """Every choice's `collect` learns that the client left, not only one of them."""
    before = scheduler_stats(server.url)
    body = {"model": NAME, "prompt": ["ROMEO:", "JULIET:"], "n": 2, "max_tokens": 240}
    try:
        httpx.post(server.url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=0.5)
        pytest.skip("the 4 x 240 tokens came within 0.5 s: too fast to leave in the middle here")
    except httpx.TimeoutException:
        pass  # the client gave up and closed the connection
    stats = wait_for(
        "the scheduler going idle", lambda: scheduler_stats(server.url), idle, timeout=60
    )
    n = sum(v for k, v in stats.items() if k.startswith("abort_")) - sum(
        v for k, v in before.items() if k.startswith("abort_")
    )
    assert n == 4, f"the client left 4 running choices: expected 4 aborts, got {n}"
    assert_all_back(stats)
