"""`python -m minisgl router` in front of real CPU workers on loopback (tests/router_fixtures.py):
the OpenAI API through it is a worker's, word for word; a worker killed mid-request gives its
clients a clear error and the router serves on; cache_aware computes fewer prefill tokens than
round_robin on a multi-tenant workload."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from minisgl.router.launch import (
    kill,
    minisgl_router,
    prefill_tokens,
    start_workers,
    stop_all,
)
from router_fixtures import GREEDY, MODEL, client, worker_urls
from server_fixtures import wait_for

PROMPTS = [
    "ROMEO:\nBut soft, what light",
    "JULIET:\nO Romeo, Romeo",
    "ROMEO:\nBut soft, what light through yonder window",  # shares the first's head
    "KING HENRY:\nOnce more unto the breach",
]


@pytest.fixture(scope="module")
def workers():
    with worker_urls(4) as urls:
        yield urls


def completion(url: str, prompt, **kw):
    return client(url).completions.create(
        model=MODEL, prompt=prompt, extra_body={"return_token_ids": True}, **GREEDY, **kw
    )


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin", "shortest_queue"])
def test_greedy_outputs_through_the_router_are_a_single_servers(workers, policy):
    direct = workers[0]
    with minisgl_router(workers[:2], "--policy", policy) as router:
        for prompt in PROMPTS + [[872, 25, 198, 3983]]:  # text, and token ids
            want, got = completion(direct, prompt).choices[0], completion(router.url, prompt)
            assert got.model == MODEL
            got = got.choices[0]
            assert (got.text, got.model_extra["token_ids"], got.finish_reason) == (
                want.text,
                want.model_extra["token_ids"],
                want.finish_reason,
            ), f"{policy}: {prompt!r}"
        chat = [
            {"role": "system", "content": "Speak as Mercutio."},
            {"role": "user", "content": "Hi"},
        ]
        want = client(direct).chat.completions.create(model=MODEL, messages=chat, **GREEDY)
        got = client(router.url).chat.completions.create(model=MODEL, messages=chat, **GREEDY)
        assert got.choices[0].message.content == want.choices[0].message.content
        # a stream passes through event by event: the same text, usage last, then [DONE]
        stream = client(router.url).chat.completions.create(
            model=MODEL,
            messages=chat,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            want.choices[0].message.content
        )
        assert chunks[-1].usage.completion_tokens == want.usage.completion_tokens
        with httpx.stream(
            "POST",
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": PROMPTS[0], "stream": True, **GREEDY},
            timeout=60,
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line]
        assert events[-1] == "data: [DONE]" and len(events) == GREEDY["max_tokens"] + 1


def test_the_router_passes_the_workers_answers_and_errors_through(workers):
    direct = workers[0]
    with minisgl_router(workers[:2]) as router:
        assert httpx.get(router.url + "/v1/models").json()["data"][0]["id"] == MODEL
        for body in (
            {"model": MODEL, "prompt": "x", "min_p": 0.1},  # a field the server does not know
            {"model": "gpt-4", "prompt": "x"},  # another model: 404
            {"model": MODEL, "prompt": "x" * 4000, "max_tokens": 4},  # too long for the context
        ):
            want = httpx.post(direct + "/v1/completions", json=body, timeout=60)
            got = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
            assert (got.status_code, got.json()) == (want.status_code, want.json())
            assert want.status_code in (400, 404)
        bad = httpx.post(
            router.url + "/v1/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        health = httpx.get(router.url + "/health").json()
        assert health == {"status": "ok", "workers": {u: "ok" for u in workers[:2]}}


def tenant_workload(tag: str, tenants: int, per_tenant: int):
    """Tenants with a long system prompt each (~100 tokens), their requests interleaved."""
    systems = [
        f"[{tag}] Tenant {t}. You are the chorus of a play in Verona; speak in verse, keep to the "
        "story of two households, both alike in dignity, and answer what is asked of you in a "
        "line or two. " * 2
        for t in range(tenants)
    ]
    return [
        systems[t] + f"Question {q}: who speaks next?"
        for q in range(per_tenant)
        for t in range(tenants)
    ]


def computed(urls, run) -> int:
    before = prefill_tokens(urls)
    run()
    after = prefill_tokens(urls)
    return sum(after[u] - before[u] for u in urls)


def test_cache_aware_computes_fewer_prefill_tokens_than_round_robin(workers):
    # 3 tenants over 4 workers: round robin sends each tenant's requests to every worker in turn
    n = {}
    for policy in ("round_robin", "cache_aware"):
        prompts = tenant_workload(policy, tenants=3, per_tenant=4)
        with minisgl_router(workers, "--policy", policy) as router:

            def run():
                for p in prompts:
                    client(router.url).completions.create(model=MODEL, prompt=p, max_tokens=2)

            n[policy] = computed(workers, run)
            trees = httpx.get(router.url + "/router/workers").json()
    # round robin computes each system prompt once per request (12 of ~100 tokens); cache aware
    # once per tenant (3), then only the questions
    assert n["cache_aware"] < 0.5 * n["round_robin"], n
    assert sum(1 for w in trees if w["tree_size"]) == 3, trees  # cache aware: a worker per tenant


@pytest.fixture
def victim():
    (server,) = start_workers(1)
    yield server
    stop_all([server])


def test_a_killed_worker_gives_clear_errors_and_the_router_serves_on(workers, victim):
    survivor = workers[1]
    with minisgl_router([victim.url, survivor], "--policy", "round_robin") as router:
        long = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 400, "ignore_eos": True}
        # round robin: the stream goes to the victim, a short request to the survivor, and a
        # long request that is not streamed to the victim again
        stream = httpx.stream(
            "POST", router.url + "/v1/completions", json={**long, "stream": True}, timeout=60
        )
        r = stream.__enter__()
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")  # the victim is answering
        ok = httpx.post(router.url + "/v1/completions", json={**long, "max_tokens": 2}, timeout=60)
        assert ok.status_code == 200
        answer = {}
        t = threading.Thread(
            target=lambda: answer.update(
                r=httpx.post(router.url + "/v1/completions", json=long, timeout=60)
            )
        )
        t.start()
        wait_for(
            "both requests running on the victim",
            lambda: httpx.get(victim.url + "/debug/scheduler", timeout=30).json(),
            lambda s: s["running"] == 2,
        )
        kill(victim)
        rest = [line for line in lines if line]
        stream.__exit__(None, None, None)
        t.join(60)
        # the stream ends with one error event naming the worker, and no [DONE]
        assert rest[-1] != "data: [DONE]"
        error = json.loads(rest[-1].removeprefix("data: "))["error"]
        assert victim.url in error["message"] and "failed while streaming" in error["message"]
        # the request that was not streamed: a 502 naming the worker
        assert answer["r"].status_code == 502, answer["r"].text
        assert victim.url in answer["r"].json()["error"]["message"]
        # the router serves on with the survivor alone, and says why the victim is out
        for _ in range(4):
            got = completion(router.url, PROMPTS[0])
            assert got.choices[0].finish_reason in ("length", "stop")
        health = httpx.get(router.url + "/health").json()
        assert health["status"] == "ok" and health["workers"][survivor] == "ok"
        assert health["workers"][victim.url] != "ok", health


def test_a_worker_answers_what_sglangs_router_asks(workers):
    """The fields sglang-router adds to every request, at its defaults, are accepted; a value that
    would change the answer is refused naming the field (minisgl/server/sglang_fields.py); the
    routes it reads a worker's model from answer (minisgl/server/sglang_routes.py)."""
    url = workers[0]
    for path in ("/server_info", "/model_info", "/get_server_info", "/get_model_info"):
        info = httpx.get(url + path).json()
        assert info["served_model_name"] == MODEL and info["model_path"].endswith(MODEL), path
    assert httpx.get(url + "/server_info").json()["tp_size"] == 1
    defaults = {
        "no_stop_trim": False,
        "ignore_eos": False,
        "skip_special_tokens": True,
        "return_hidden_states": False,
    }
    chat_defaults = {
        **defaults,
        "continue_final_message": False,
        "separate_reasoning": True,
        "stream_reasoning": True,
    }
    body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 2, "temperature": 0}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert httpx.post(url + "/v1/completions", json={**body, **defaults}).status_code == 200
    assert (
        httpx.post(url + "/v1/chat/completions", json={**chat, **chat_defaults}).status_code == 200
    )
    for field, value, route, base in [
        ("no_stop_trim", True, "/v1/completions", body),
        ("skip_special_tokens", False, "/v1/completions", body),
        ("return_hidden_states", True, "/v1/chat/completions", chat),
        ("continue_final_message", True, "/v1/chat/completions", chat),
    ]:
        r = httpx.post(url + route, json={**base, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    # a chat field on a completion is still an unknown field
    r = httpx.post(url + "/v1/completions", json={**body, "continue_final_message": False})
    assert r.status_code == 400 and "continue_final_message" in r.json()["error"]["message"]
