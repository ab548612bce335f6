"""The router's parts alone (minisgl/router): its pool, its options, its keys, its app."""

from __future__ import annotations

import json

import pytest

from minisgl.router.keys import routing_key
from minisgl.router.policy import Balance, RoundRobin
from minisgl.router.workers import NoWorker, WorkerPool

# the tree and the routing rule alone are chapter 25's exercises: tests/test_ch25_router.py

BAL = Balance(abs_threshold=4, rel_threshold=2.0, cache_threshold=0.5)


def test_balance_thresholds_are_checked():
    for bad, word in [
        (dict(abs_threshold=-1), "abs"),
        (dict(rel_threshold=0.5), "rel"),
        (dict(cache_threshold=1.5), "cache"),
    ]:
        with pytest.raises(ValueError, match=word):
            Balance(**bad)


def test_round_robin_cycles_and_follows_a_smaller_pool():
    rr = RoundRobin()
    assert [rr.choose(3) for _ in range(4)] == [0, 1, 2, 0]
    assert rr.choose(1) == 0 and rr.choose(2) == 1


def test_the_pool_routes_a_tenant_to_the_worker_that_has_its_prefix():
    pool = WorkerPool(["http://a", "http://b"], "cache_aware", BAL, max_tree_size=1000)
    system = "You are the nurse of Juliet. " * 4
    first = pool.pick(system + "Where is she?")
    second = pool.pick("A different tenant entirely, with its own long preamble. " * 2)
    assert first is not second  # the new tenant goes to the empty tree
    assert pool.pick(system + "What hour is it?") is first
    first.load = 10  # far busier than b (past 4 apart and 2 times)
    assert pool.pick(system + "Is she up?") is second
    assert first.tree.size <= 1000 and second.tree.size <= 1000


def test_the_pool_bounds_each_tree():
    pool = WorkerPool(["http://a"], "cache_aware", BAL, max_tree_size=100)
    for i in range(20):
        pool.pick(f"tenant {i}: " + "x" * 30)
    assert pool.workers[0].tree.size <= 100


def test_the_pool_skips_workers_taken_out_and_says_why_when_none_is_left():
    pool = WorkerPool(["http://a", "http://b"], "round_robin")
    a, b = pool.workers
    pool.take_out(a, "/health answered 503")
    assert {pool.pick(None).url for _ in range(3)} == {"http://b"}
    with pytest.raises(NoWorker, match="http://a: /health answered 503"):
        pool.pick(None, exclude=[b])
    pool.put_back(a)
    assert {pool.pick(None).url for _ in range(2)} == {"http://a", "http://b"}


def test_the_pool_refuses_bad_settings():
    with pytest.raises(ValueError, match="at least one worker"):
        WorkerPool([], "round_robin")
    with pytest.raises(ValueError, match="listed twice"):
        WorkerPool(["http://a", "http://a/"], "round_robin")
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        WorkerPool(["http://a"], "fastest")
    with pytest.raises(ValueError, match="max tree size"):
        WorkerPool(["http://a"], "cache_aware", max_tree_size=0)


def test_shortest_queue_takes_the_least_loaded():
    pool = WorkerPool(["http://a", "http://b", "http://c"], "shortest_queue")
    pool.workers[0].load, pool.workers[1].load, pool.workers[2].load = 3, 1, 2
    assert pool.pick("anything").url == "http://b"


def test_routing_keys():
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    body = json.dumps({"model": "m", "messages": chat}).encode()
    assert routing_key("/v1/chat/completions", body) == json.dumps(chat)
    # a longer conversation's key starts with the shorter one's system message
    longer = routing_key(
        "/v1/chat/completions",
        json.dumps({"messages": chat + [{"role": "user", "content": "V"}]}).encode(),
    )
    assert longer.startswith(json.dumps(chat)[:-1])
    assert routing_key("/v1/completions", b'{"prompt": "abc"}') == "abc"
    assert routing_key("/v1/completions", b'{"prompt": [1, 2, 3]}') == (1, 2, 3)
    assert routing_key("/v1/completions", b'{"prompt": ["abc", "def"]}') == "abc"
    assert routing_key("/v1/completions", b'{"prompt": [[4, 5], [6]]}') == (4, 5)
    for bad in (b"{not json", b"[1, 2]", b'{"prompt": 5}', b'{"prompt": [1, "a"]}', b"\xff"):
        assert routing_key("/v1/completions", bad) is None
    assert routing_key("/v1/chat/completions", b'{"messages": "hi"}') is None


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--workers", "localhost:1"], "not an http:// or https:// URL: localhost:1"),
        (["--workers", "http://a", "--balance-rel-threshold", "0.5"], "rel threshold must be >= 1"),
        (["--workers", "http://a", "http://a/"], "listed twice"),
        (["--workers", "http://a", "--health-interval", "0"], "--health-interval must be positive"),
    ],
)
def test_the_router_command_refuses_bad_options(argv, said, capsys):
    from minisgl.__main__ import main

    with pytest.raises(SystemExit) as exit:
        main(["router", *argv])
    assert exit.value.code == 2 and said in capsys.readouterr().err


def test_the_router_names_a_worker_that_never_answers(capsys):
    from minisgl.__main__ import main

    code = main(
        ["router", "--workers", "http://127.0.0.1:9", "--port", "0", "--startup-timeout", "0.5"]
    )
    err = capsys.readouterr().err
    assert code == 1 and "did not answer /health" in err and "http://127.0.0.1:9" in err


def test_the_router_app_guards_bodies_and_says_when_no_worker_can_answer():
    from fastapi.testclient import TestClient

    from minisgl.router.app import create_router_app

    dead = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
    app = create_router_app(WorkerPool([dead], "round_robin"), max_request_bytes=100)
    with TestClient(app) as c:
        json_type = {"content-type": "application/json"}
        r = c.post("/v1/completions", content=b"x" * 200, headers=json_type)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert app.state.pool.workers[0].out is None  # refused before any worker was asked
        r = c.post("/v1/completions", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 400 and "text/plain" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 503, r.text
        assert f"{dead}: connection failed" in r.json()["error"]["message"]
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["workers"][dead] != "ok"
        assert c.get("/router/workers").json()[0]["healthy"] is False
