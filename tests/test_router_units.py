"""The router's parts alone (minisgl/router): its prefix tree, its routing rule, its keys."""

from __future__ import annotations

import json

import pytest

from minisgl.router.keys import routing_key
from minisgl.router.policy import Balance, RoundRobin, cache_aware, imbalanced
from minisgl.router.tree import PrefixTree
from minisgl.router.workers import NoWorker, WorkerPool


def test_match_is_the_longest_prefix_any_inserted_key_shares():
    t = PrefixTree()
    assert t.insert("hello world") == 0
    assert t.insert("hello there") == 6  # "hello " was there
    assert t.match("hello wo") == 8
    assert t.match("hello world and more") == 11
    assert t.match("help") == 3
    assert t.match("xyz") == 0
    assert t.match("") == 0
    assert t.size == len("hello ") + len("world") + len("there")


def test_a_key_inside_an_edge_splits_it_and_counts_once():
    t = PrefixTree()
    t.insert("abcdef")
    assert t.insert("abc") == 3
    assert t.size == 6  # the split shares "abc": no element twice
    assert t.match("abcdef") == 6 and t.match("abcx") == 3
    t.insert("abcxyz")
    assert t.size == 9 and t.match("abcxy") == 5
    # a key that leaves an edge midway stops there: what hangs below the edge is not its prefix
    assert t.match("abdef") == 2 and t.match("axyz") == 1


def test_token_id_keys_and_text_keys_share_nothing():
    t = PrefixTree()
    t.insert((1, 2, 3, 4))
    assert t.match((1, 2, 3, 9)) == 3
    assert t.match("abc") == 0
    t.insert("ab")
    assert t.match((1, 2)) == 2 and t.match("abc") == 2


def test_evict_drops_least_recently_used_leaves_until_within_size():
    a, b = "shared-system-prompt:tenant-a", "shared-system-prompt:tenant-b"
    t = PrefixTree()
    t.insert(a)
    t.insert(b)
    t.insert("other")
    t.match(a)  # a is used again: b's leaf (its last character) and "other" are older
    size = t.size
    assert t.evict(size - 1) == 1  # b's leaf, the least recently used: whole, nothing more
    assert t.size == size - 1 and t.match(b) == len(b) - 1 and t.match("other") == 5
    t.match(a)
    assert t.evict(size - 2) == len("other")  # now the oldest leaf
    assert t.match("other") == 0 and t.match(a) == len(a) and t.size == len(a)
    assert t.evict(len(a)) == 0  # within the bound: nothing goes
    assert t.evict(0) == len(a) and t.size == 0 and t.match("shared") == 0
    with pytest.raises(ValueError, match="max_size"):
        t.evict(-1)


def test_evict_frees_a_parent_left_without_children():
    t = PrefixTree()
    t.insert("aaaa-b")
    t.insert("aaaa-c")
    t.match("zzz")  # touches nothing
    t.evict(0)
    assert t.size == 0 and t.root.children == {}


BAL = Balance(abs_threshold=4, rel_threshold=2.0, cache_threshold=0.5)


def test_imbalance_needs_both_thresholds():
    assert not imbalanced([0, 4], BAL)  # 4 apart is not past 4
    assert imbalanced([0, 5], BAL)
    assert not imbalanced([10, 15], BAL)  # 5 apart, but 15 is not past 2 x 10
    assert imbalanced([10, 21], BAL)


def test_cache_aware_takes_the_longest_match_past_the_threshold():
    # worker 1 holds 8 of 10 elements: it wins, though it is busier (not past the thresholds)
    assert cache_aware([2, 8, 0], 10, [0, 3, 0], [50, 40, 10], BAL) == 1
    # a match of half or less loses to the worker with the smallest tree (room for a new prefix)
    assert cache_aware([2, 5, 0], 10, [0, 0, 0], [50, 40, 10], BAL) == 2
    # imbalanced: the least loaded worker, whatever it holds
    assert cache_aware([2, 10, 0], 10, [1, 9, 2], [50, 40, 10], BAL) == 0
    # ties go to the first listed
    assert cache_aware([6, 6], 10, [0, 0], [1, 1], BAL) == 0
    assert cache_aware([0, 0], 0, [0, 0], [3, 3], BAL) == 0
    with pytest.raises(ValueError, match="one match, load and size per worker"):
        cache_aware([1], 10, [0, 0], [1, 1], BAL)


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
