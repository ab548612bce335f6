"""`python -m minisgl serve` against the official `openai` client, on 127.0.0.1 (one server for the
module): completions and chat, streamed and not, equal to the offline `LLM.generate` token for token
(compared by the token ids the server returns with the `return_token_ids` extension); 32 concurrent
streaming clients; clients that leave mid-stream; malformed requests; a clean stop."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers import MODEL, PROMPT_TEXTS, assert_tokens_equal, build_llm
from helpers import test_device as device_under_test
from minisgl import SamplingParams
from minisgl.server.background import wait_gone
from server_fixtures import (
    assert_all_back,
    idle,
    scheduler_stats,
    wait_for,
)

NAME = MODEL.name
IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def llm():
    return build_llm()


def offline(llm, prompts, max_tokens):
    """Greedy outputs of the offline engine, with EOS ending a request as it does on the server."""
    return llm.generate(prompts, SamplingParams(max_tokens=max_tokens))


def chat_prompt_ids(messages):
    """The chat's prompt as transformers renders it from the model directory (an independent oracle
    for the server's chat template)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [NAME], (
        "/v1/models should list the served model"
    )
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok", f"/health should say ok, said {health}"


def test_completion_equals_offline(client, llm):
    want = offline(llm, [PROMPT_TEXTS[0]], 12)[0]
    r = client.completions.create(
        model=NAME, prompt=PROMPT_TEXTS[0], max_tokens=12, temperature=0, extra_body=IDS
    )
    got = r.choices[0]
    assert_tokens_equal(
        [got.model_extra["token_ids"]], [want["token_ids"]], "completion vs LLM.generate"
    )
    assert got.text == want["text"], f"expected the text {want['text']!r}, got {got.text!r}"
    n = len(want["token_ids"])
    assert r.usage.completion_tokens == n and r.usage.prompt_tokens == len(
        llm.encode(PROMPT_TEXTS[0])
    ), (
        f"usage should count {len(llm.encode(PROMPT_TEXTS[0]))} prompt and {n} completion "
        f"tokens, got {r.usage}"
    )
    reason = "stop" if n < 12 else "length"
    assert got.finish_reason == reason, (
        f"{n} of 12 tokens: finish_reason should be {reason!r}, got {got.finish_reason!r}"
    )


def test_streamed_completion_equals_offline(client, llm):
    ids = llm.encode(PROMPT_TEXTS[1]).tolist()  # a prompt given as token ids
    want = offline(llm, [ids], 10)[0]
    stream = client.completions.create(
        model=NAME,
        prompt=ids,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IDS,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokens = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
    assert_tokens_equal([tokens], [want["token_ids"]], "streamed completion vs LLM.generate")
    assert text == want["text"], (
        f"the streamed pieces should join to {want['text']!r}, got {text!r}"
    )
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("stop", "length") and not any(reasons[:-1]), (
        f"only the last chunk should carry a finish_reason, got {reasons}"
    )
    u = chunks[-1].usage
    assert u is not None and (u.prompt_tokens, u.completion_tokens) == (len(ids), len(tokens)), (
        f"include_usage: the last chunk should count {len(ids)} prompt and {len(tokens)} "
        "completion tokens, "
        f"got {(u.prompt_tokens, u.completion_tokens) if u else None}"
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_chat_equals_offline(client, llm, stream):
    messages = [
        {"role": "system", "content": "A street in Verona."},
        {"role": "user", "content": "Good morrow, cousin."},
    ]
    want = offline(llm, [chat_prompt_ids(messages)], 10)[0]
    r = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=10, temperature=0, stream=stream, extra_body=IDS
    )
    if stream:
        chunks = list(r)
        assert chunks[0].choices[0].delta.role == "assistant", (
            "a chat stream's first chunk should name the role"
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        tokens = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    else:
        assert r.choices[0].message.role == "assistant", (
            f"the reply's role should be assistant, got {r.choices[0].message.role}"
        )
        text, tokens = r.choices[0].message.content, r.choices[0].model_extra["token_ids"]
    assert_tokens_equal(
        [tokens], [want["token_ids"]], "chat vs LLM.generate on the chat template's prompt"
    )
    assert text == want["text"], f"expected the reply {want['text']!r}, got {text!r}"


def test_32_concurrent_streams_equal_offline(client, llm):
    speakers = ["ROMEO", "JULIET", "HAMLET", "KING LEAR", "MACBETH", "PORTIA", "OTHELLO", "PUCK"]
    starts = ["I pray you", "What news", "Good night", "O, speak again"]
    prompts = [f"{s}:\n{w}" for s in speakers for w in starts]
    max_tokens = [4 + i % 5 for i in range(32)]
    want = [llm.generate([p], SamplingParams(max_tokens=m))[0] for p, m in zip(prompts, max_tokens)]

    def one(i):
        stream = client.completions.create(
            model=NAME,
            prompt=prompts[i],
            max_tokens=max_tokens[i],
            temperature=0,
            stream=True,
            extra_body=IDS,
        )
        chunks = list(stream)
        return [t for c in chunks for t in c.choices[0].model_extra["token_ids"]], "".join(
            c.choices[0].text for c in chunks
        )

    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(one, range(32)))
    assert_tokens_equal(
        [g[0] for g in got], [w["token_ids"] for w in want], "32 concurrent streams vs LLM.generate"
    )
    wrong = next((i for i in range(32) if got[i][1] != want[i]["text"]), None)
    assert wrong is None, (
        f"stream {wrong}: expected the text {want[wrong]['text']!r}, got {got[wrong][1]!r}"
    )


def test_null_max_tokens_means_the_default(client):
    r = client.completions.create(
        model=NAME, prompt="ROMEO:", max_tokens=None, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 16, (
        f"max_tokens null: the OpenAI API's default of 16 tokens, got {r.usage.completion_tokens}"
    )


def test_sse_framing(server):
    """Server-sent events as the OpenAI API sends them: `data: <json>` events, each ended by a blank
    line, and `data: [DONE]` last (clients that read the raw stream stop on it)."""
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 3, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream"), (
            f"a stream should be text/event-stream, got {r.headers['content-type']}"
        )
        raw = "".join(r.iter_text())
    assert raw.endswith("\n\n"), (
        f"every event should end with a blank line; the stream ends {raw[-20:]!r}"
    )
    events = raw[:-2].split("\n\n")
    bad = next((e for e in events if not e.startswith("data: ") or "\n" in e), None)
    assert bad is None, f"each event should be one 'data: ' line, got {bad!r}"
    assert events[-1] == "data: [DONE]", (
        f"the last event should be 'data: [DONE]', got {events[-1]!r}"
    )
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", (
        "the last chunk before [DONE] should carry finish_reason 'length', got "
        f"{chunks[-1]['choices']}"
    )


def test_clients_leaving_mid_stream_abort_and_give_everything_back(server, client):
    before = scheduler_stats(server.url)
    for i in range(4):
        stream = client.completions.create(
            model=NAME,
            prompt=PROMPT_TEXTS[i],
            max_tokens=200,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        next(iter(stream))
        stream.close()  # the client goes away with ~200 tokens still to come

    def aborted(s):
        return sum(v for k, v in s.items() if k.startswith("abort_")) - sum(
            v for k, v in before.items() if k.startswith("abort_")
        )

    # Idle: every request has ended, aborted or (if the aborts never came) run to its end.
    stats = wait_for(
        "the scheduler going idle", lambda: scheduler_stats(server.url), idle, timeout=60
    )
    # On a CPU the 200 tokens take far longer than noticing a client leave (~30 ms): every
    # request is aborted. A GPU can run the bundled model's 200 steps in about that time, so
    # there a request may end on its own first; at least one must still be aborted.
    want = 4 if device_under_test() == "cpu" else 1
    assert aborted(stats) >= want, f"4 clients left: expected {want}+ aborts, got {aborted(stats)}"
    assert aborted(stats) <= 4
    assert_all_back(stats)


def test_a_client_leaving_a_plain_request_aborts_it(server):
    before = scheduler_stats(server.url)
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 240, "ignore_eos": True}
    try:
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
        pytest.skip("the 240 tokens came within 0.5 s: too fast to leave in the middle here")
    except httpx.TimeoutException:
        pass  # the client gave up and closed the connection
    stats = wait_for(
        "the scheduler going idle", lambda: scheduler_stats(server.url), idle, timeout=60
    )
    n = sum(v for k, v in stats.items() if k.startswith("abort_")) - sum(
        v for k, v in before.items() if k.startswith("abort_")
    )
    assert n == 1, f"the client left before its answer: expected 1 abort, got {n}"
    assert_all_back(stats)


MALFORMED = [  # (path, body, status, what the message must name)
    ("completions", b"{not json", 400, "json"),
    ("completions", b"[1, 2]", 400, "body"),
    ("completions", {"prompt": "hi"}, 400, "model"),
    ("completions", {"model": "gpt-4", "prompt": "hi"}, 404, "gpt-4"),
    ("completions", {"model": NAME, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("completions", {"model": NAME, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": 300}, 400, "context length"),
    ("completions", {"model": NAME, "prompt": "hi", "temperature": "warm"}, 400, "temperature"),
    ("completions", {"model": NAME, "prompt": "hi " * 300, "max_tokens": 1}, 400, "context length"),
    ("completions", {"model": NAME, "prompt": [5, -3]}, 400, "vocabulary"),
    ("completions", {"model": NAME, "prompt": [5, 2**40]}, 400, "vocabulary"),
    ("completions", {"model": NAME, "prompt": []}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": "hi", "n": 0}, 400, "n"),
    ("completions", {"model": NAME, "prompt": ["hi"] * 1025, "n": 2}, 400, "2048 choices"),
    ("completions", {"model": NAME, "prompt": "hi", "stop": [3]}, 400, "stop"),
    ("chat/completions", {"model": NAME, "messages": []}, 400, "messages"),
    (
        "chat/completions",
        {"model": NAME, "messages": [{"role": "wizard", "content": "hi"}]},
        400,
        "role",
    ),
    (
        "chat/completions",
        {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 300},
        400,
        "context length",
    ),
]


@pytest.mark.parametrize(
    "path,body,status,words", MALFORMED, ids=[f"{m[0]}-{m[3]}" for m in MALFORMED]
)
def test_malformed_request_answered_and_server_keeps_serving(
    server, client, path, body, status, words
):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(
        f"{server.url}/v1/{path}",
        headers={"content-type": "application/json"},
        timeout=30,
        **kwargs,
    )
    assert r.status_code == status, f"expected status {status}, got {r.status_code}: {r.text[:200]}"
    error = r.json().get("error")
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, (
        "expected an OpenAI error body {'error': {message, type, param, code}}, got "
        f"{r.text[:200]}"
    )
    assert words in error["message"].lower() or words == error["param"], (
        f"the error should name {words!r}, said {error['message']!r}"
    )
    after = client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=2, temperature=0)
    assert after.usage.completion_tokens >= 1, "the server should go on serving after a bad request"


def test_sigterm_stops_every_process(server):
    """Last: it stops the module's server."""
    workers = list(httpx.get(server.url + "/health").json()["workers"].values())
    assert len(workers) == 2, (
        f"/health should name the scheduler's and the tokenizer's pids, got {workers}"
    )
    assert_all_back(scheduler_stats(server.url))
    code = server.stop()
    assert code == 0, f"SIGTERM should stop the server cleanly (exit code 0), got {code}"
    left = wait_gone(workers, 10)
    assert not left, f"the server stopped but its worker process(es) {left} are still running"
