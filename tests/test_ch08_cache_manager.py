"""Chapter 8: the CacheManager. Who owns which KV page: paged allocation, handing finished work to
the prefix cache, the integrity check, and admission control when the KV pool is small."""

from __future__ import annotations

from typing import List

import pytest
import torch
from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids

from minisgl.core import Req
from minisgl.kvcache import CacheHandle
from minisgl.message import UserMsg
from minisgl.scheduler import CacheManager, pages_for


pytestmark = pytest.mark.usefixtures("normal_loop")  # conftest.py: chapter 11 is not here yet


def _manager(num_pages: int, page_size: int, cache_type: str, rows: int = 3, cols: int = 64) -> CacheManager:
    return CacheManager(num_pages, page_size, torch.zeros(rows, cols, dtype=torch.int32), cache_type)


def _req(row: int, ids: List[int], max_tokens: int = 8) -> Req:
    return Req(torch.tensor(ids, dtype=torch.int32), row, 0, max_tokens, row, greedy(max_tokens), CacheHandle(0))


def _assert_paged(locs: List[int], page_size: int, what: str) -> None:
    """Token j of a request lives at offset j % page_size of the page that holds its whole block."""
    for j, loc in enumerate(locs):
        assert loc % page_size == j % page_size, f"{what}: token {j} is at offset {loc % page_size} of its page"
        assert loc // page_size == locs[j - j % page_size] // page_size, \
            f"{what}: tokens {j - j % page_size} and {j} should share a page"


# ---------------------------------------------------------------- allocate_paged


def _advance(req: Req, device_len: int) -> None:
    """The request's tokens so far are computed; the next step processes up to `device_len`."""
    req.cached_len, req.device_len = req.device_len, device_len


def test_allocate_paged_takes_whole_pages_and_fills_the_last_one_first():
    cm = _manager(num_pages=8, page_size=4, cache_type="naive")
    req = _req(1, list(range(10, 15)))  # 5 prompt tokens: 2 pages
    cm.allocate_paged([req])
    assert cm.num_free_pages == 6
    locs = cm.page_table[1, :5].tolist()
    _assert_paged(locs, 4, "prefill")
    first_pages = {loc // 4 for loc in locs}
    assert len(first_pages) == 2

    _advance(req, 6)  # the prompt is cached; one decode token at position 5
    cm.allocate_paged([req])
    assert cm.num_free_pages == 6, "position 5 fits in the request's half-full last page"
    _advance(req, 8)  # two tokens at once (positions 6 and 7) still fit
    cm.allocate_paged([req])
    assert cm.num_free_pages == 6
    _advance(req, 9)  # position 8 opens a third page
    cm.allocate_paged([req])
    assert cm.num_free_pages == 5
    locs = cm.page_table[1, :9].tolist()
    _assert_paged(locs, 4, "after decoding")
    assert {loc // 4 for loc in locs[:8]} == first_pages, "earlier locations must not move"


def test_allocate_paged_gives_each_request_its_own_pages():
    cm = _manager(num_pages=16, page_size=4, cache_type="naive")
    a, b = _req(0, list(range(6))), _req(2, list(range(3)))
    cm.allocate_paged([a, b])
    assert cm.num_free_pages == 16 - 2 - 1
    pages_a = {loc // 4 for loc in cm.page_table[0, :6].tolist()}
    pages_b = {loc // 4 for loc in cm.page_table[2, :3].tolist()}
    assert not pages_a & pages_b, "two requests were given the same page"
    for req in (a, b):
        req.complete_one()
    cm.allocate_paged([a, b])  # both still have room in their last page
    assert cm.num_free_pages == 13
    assert int(cm.page_table[0, 6]) // 4 in pages_a and int(cm.page_table[2, 3]) // 4 in pages_b


def test_running_requests_hold_page_aligned_disjoint_pages():
    llm = build_llm(page_size=4, cache_type="naive")
    p = prompt_ids()
    counts = [9, 3, 6, 5]
    uids = [llm.add_request(ids, greedy(n)) for ids, n in zip(p, counts)]
    while llm.busy:
        llm.step()
        owner = {}
        for req in llm.decode_manager.running.values():
            locs = llm.page_table[req.table_idx, : req.cached_len].tolist()
            _assert_paged(locs, 4, f"request {req.uid}")
            pages = {loc // 4 for loc in locs}
            assert len(pages) == pages_for(req.cached_len, 4), f"request {req.uid} holds extra pages"
            for page in pages:
                assert page not in owner, f"page {page} is held by requests {owner.get(page)} and {req.uid}"
                owner[page] = req.uid
    ref = hf_greedy(p, 9)
    assert_tokens_equal([llm.results[u].token_ids for u in uids], [r[:n] for r, n in zip(ref, counts)])
    assert llm.cache_manager.num_free_pages == llm.cache_manager.num_pages, "the naive cache keeps nothing"
    llm.cache_manager.check_integrity()


# ---------------------------------------------------------------- cache_req


def test_cache_req_shares_duplicates_and_frees_what_the_cache_does_not_take():
    cm = _manager(num_pages=16, page_size=4, cache_type="radix")
    prompt = list(range(20, 30))  # 10 tokens: 2 whole pages + 2 tokens
    a, b = _req(0, prompt), _req(1, prompt)
    cm.allocate_paged([a, b])  # prefilled side by side: both computed the whole prompt
    a.complete_one()
    b.complete_one()
    assert cm.num_free_pages == 16 - 3 - 3

    cm.cache_req(a, finished=False)
    cache = cm.prefix_cache
    assert a.cache_handle.cached_len == 8, "only whole pages go to the cache"
    assert cache.protected_size == 8, "a running request's cached prefix must be locked"
    assert cm.num_free_pages == 10, "a's pages were new to the cache: nothing to free"

    b_row_before = cm.page_table[1, :10].clone()
    cm.cache_req(b, finished=False)
    assert cm.num_free_pages == 12, "b's copy of the 2 cached pages is a duplicate and must be freed"
    assert cm.page_table[1, :8].tolist() == cm.page_table[0, :8].tolist(), "b must now use the cache's copy"
    assert cm.page_table[1, 8:10].tolist() == b_row_before[8:10].tolist(), "b's own last page stays"
    assert b.cache_handle.cached_len == 8 and cache.protected_size == 8

    cm.cache_req(a, finished=True)
    assert cm.num_free_pages == 13, "a's partial last page goes back"
    assert cache.protected_size == 8, "b still runs on the shared prefix"
    cm.cache_req(b, finished=True)
    assert cm.num_free_pages == 14
    assert cache.protected_size == 0 and cache.evictable_size == 8
    cm.check_integrity()


def test_finished_requests_leave_their_whole_sequence_in_the_cache():
    llm = build_llm()
    p = prompt_ids()
    out = llm.generate(p, greedy(6))
    llm.cache_manager.check_integrity()
    cache = llm.cache_manager.prefix_cache
    for ids, o in zip(p, out):
        handle, _ = cache.match_prefix(torch.tensor(ids + o["token_ids"]))
        # every token whose KV was computed: all but the last sampled one
        assert handle.cached_len == len(ids) + 5
    assert cache.protected_size == 0
    assert llm.cache_manager.num_free_pages + cache.size == llm.cache_manager.num_pages


# ---------------------------------------------------------------- check_integrity


def _used_llm(page_size: int = 1):
    llm = build_llm(page_size=page_size)
    llm.generate(prompt_ids(), greedy(4))
    llm.cache_manager.check_integrity()  # a healthy state passes
    return llm


def _cached_page(cm: CacheManager) -> torch.Tensor:
    return (cm.prefix_cache.all_indices()[:1] // cm.page_size).to(cm.free_pages.dtype)


@pytest.mark.parametrize("page_size", [1, 4])
def test_integrity_check_detects_a_leaked_page(page_size):
    cm = _used_llm(page_size).cache_manager
    cm.free_pages = cm.free_pages[1:]  # a page nobody owns any more
    with pytest.raises(AssertionError) as err:
        cm.check_integrity()
    assert str(err.value).strip(), "say what is wrong"


@pytest.mark.parametrize("page_size", [1, 4])
def test_integrity_check_detects_a_page_both_free_and_cached(page_size):
    cm = _used_llm(page_size).cache_manager
    cm.free_pages = torch.cat([cm.free_pages[1:], _cached_page(cm)])  # counts add up; one page is twice
    with pytest.raises(AssertionError) as err:
        cm.check_integrity()
    assert str(err.value).strip(), "say what is wrong"


def test_integrity_check_detects_a_page_freed_twice():
    cm = _used_llm().cache_manager
    cm.free_pages = torch.cat([cm.free_pages, _cached_page(cm)])  # one page too many
    with pytest.raises(AssertionError):
        cm.check_integrity()
    cm = _used_llm().cache_manager
    cm.free_pages = torch.cat([cm.free_pages[1:], cm.free_pages[1:2]])  # in the free list twice
    with pytest.raises(AssertionError):
        cm.check_integrity()


# ---------------------------------------------------------------- admission control


def _small_pool(p: List[List[int]], max_tokens: int, fits: int, page_size: int) -> int:
    """A pool that holds about `fits` of the largest requests at once."""
    return fits * pages_for(max(len(ids) for ids in p) + max_tokens, page_size) + 1


@pytest.mark.parametrize("cache_type,page_size", [("naive", 1), ("radix", 1), ("radix", 4)])
def test_requests_wait_for_memory_and_all_complete(cache_type, page_size):
    p = prompt_ids()
    n = 8
    num_pages = _small_pool(p, n, fits=2, page_size=page_size)
    llm = build_llm(cache_type=cache_type, page_size=page_size, num_page_override=num_pages)
    log = llm.events.record()
    out = llm.generate(p + p[::-1], greedy(n))  # 8 requests; about 2 fit at a time
    ref = hf_greedy(p, n)
    assert_tokens_equal([o["token_ids"] for o in out], ref + ref[::-1])
    running = max(len(e["uids"]) for e in log if e.kind == "launch" and e["phase"] == "decode")
    assert running < 8, "the pool cannot hold every request: some must have waited"
    assert not [e for e in log if e.kind == "reject"], "requests that fit one at a time must not be refused"
    assert llm.table_manager.available_size == llm.table_manager.capacity
    llm.cache_manager.check_integrity()


def test_a_request_that_can_never_fit_is_refused_while_others_run():
    p = prompt_ids()
    n = 6
    num_pages = _small_pool(p, n, fits=1, page_size=1)
    llm = build_llm(num_page_override=num_pages)
    log = llm.events.record()
    huge = (p[3] * 8)[: num_pages]  # prompt + max_tokens is more than the whole pool

    uids = [llm.add_request(ids, greedy(n)) for ids in p[:2]]
    with pytest.raises(ValueError, match="pages"):
        llm.add_request(huge, greedy(n))
    with pytest.raises(ValueError, match="prompt 1: .*pages"):
        llm.generate([p[0], huge], greedy(n))
    # A frontend that did not check first: the scheduler itself must refuse it, and not crash.
    llm.io.put(UserMsg(uid=1000, input_ids=torch.tensor(huge, dtype=torch.int32), sampling_params=greedy(n)))
    uids.append(llm.add_request(p[2], greedy(n)))
    llm.run_until_idle()

    rejects = [e for e in log if e.kind == "reject"]
    assert [e["uid"] for e in rejects] == [1000] and "pages" in rejects[0]["reason"]
    errors = [m for e in log if e.kind == "send" for m in e["msgs"] if m.uid == 1000]
    assert len(errors) == 1 and errors[0].finished and errors[0].error
    assert 1000 not in {u for e in log if e.kind == "launch" for u in e["uids"]}
    assert_tokens_equal([llm.results[u].token_ids for u in uids], hf_greedy(p[:3], n))
    llm.cache_manager.check_integrity()
