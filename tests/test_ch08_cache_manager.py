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
from minisgl.utils import EventLog
from refusals import refuses

pytestmark = pytest.mark.usefixtures("normal_loop")  # conftest.py: chapter 11 is not here yet


def _manager(
    num_pages: int, page_size: int, cache_type: str, rows: int = 3, cols: int = 64
) -> CacheManager:
    return CacheManager(
        num_pages, page_size, torch.zeros(rows, cols, dtype=torch.int32), cache_type
    )


def _req(row: int, ids: List[int], max_tokens: int = 8) -> Req:
    return Req(
        torch.tensor(ids, dtype=torch.int32),
        row,
        0,
        max_tokens,
        row,
        greedy(max_tokens),
        CacheHandle(0),
    )


def _assert_paged(locs: List[int], page_size: int, what: str) -> None:
    """Token j of a request lives at offset j % page_size of the page that holds its whole block."""
    for j, loc in enumerate(locs):
        assert loc % page_size == j % page_size, (
            f"{what}: token {j} is at offset {loc % page_size} of its page"
        )
        assert loc // page_size == locs[j - j % page_size] // page_size, (
            f"{what}: tokens {j - j % page_size} and {j} should share a page"
        )


# ---------------------------------------------------------------- allocate_paged


def _advance(req: Req, device_len: int) -> None:
    """The request's tokens so far are computed; the next step processes up to `device_len`."""
    req.cached_len, req.device_len = req.device_len, device_len


def test_allocate_paged_takes_whole_pages_and_fills_the_last_one_first():
    cm = _manager(num_pages=8, page_size=4, cache_type="naive")
    req = _req(1, list(range(10, 15)))  # 5 prompt tokens: 2 pages
    cm.allocate_paged([req])
    assert cm.num_free_pages == 6, (
        f"5 prompt tokens need 2 pages of 4, but {8 - cm.num_free_pages} were taken"
    )
    locs = cm.page_table[1, :5].tolist()
    _assert_paged(locs, 4, "prefill")
    first_pages = {loc // 4 for loc in locs}
    assert len(first_pages) == 2, f"5 prompt tokens should sit in 2 pages, not {len(first_pages)}"

    _advance(req, 6)  # the prompt is cached; one decode token at position 5
    cm.allocate_paged([req])
    assert cm.num_free_pages == 6, "position 5 fits in the request's half-full last page"
    _advance(req, 8)  # two tokens at once (positions 6 and 7) still fit
    cm.allocate_paged([req])
    assert cm.num_free_pages == 6, "positions 6 and 7 fit in the request's last page"
    _advance(req, 9)  # position 8 opens a third page
    cm.allocate_paged([req])
    assert cm.num_free_pages == 5, (
        f"position 8 needs exactly one new page, but {6 - cm.num_free_pages} were taken"
    )
    locs = cm.page_table[1, :9].tolist()
    _assert_paged(locs, 4, "after decoding")
    assert {loc // 4 for loc in locs[:8]} == first_pages, "earlier locations must not move"


def test_allocate_paged_gives_each_request_its_own_pages():
    cm = _manager(num_pages=16, page_size=4, cache_type="naive")
    a, b = _req(0, list(range(6))), _req(2, list(range(3)))
    cm.allocate_paged([a, b])
    assert cm.num_free_pages == 16 - 2 - 1, (
        f"6 and 3 tokens need 2 + 1 pages, but {16 - cm.num_free_pages} were taken"
    )
    pages_a = {loc // 4 for loc in cm.page_table[0, :6].tolist()}
    pages_b = {loc // 4 for loc in cm.page_table[2, :3].tolist()}
    assert not pages_a & pages_b, "two requests were given the same page"
    for req in (a, b):
        req.complete_one()
    cm.allocate_paged([a, b])  # both still have room in their last page
    assert cm.num_free_pages == 13, f"no page was needed, but {13 - cm.num_free_pages} were taken"
    assert int(cm.page_table[0, 6]) // 4 in pages_a and int(cm.page_table[2, 3]) // 4 in pages_b, (
        "a decode token that fits in the request's last page must go there"
    )


def _pages_alloc(log) -> List[tuple]:
    """(uid, pages) of each pages_alloc event, in uid order."""
    return sorted((e["uid"], e["pages"]) for e in log if e.kind == "pages_alloc")


def test_allocate_paged_writes_only_this_steps_positions_and_reports_the_pages_it_gives():
    events = EventLog()
    log = events.record()
    cm = CacheManager(16, 4, torch.full((3, 32), -1, dtype=torch.int32), "naive", events)
    a, b = _req(0, list(range(7))), _req(2, list(range(2)))  # prefills of 2 pages and 1 page
    cm.allocate_paged([a, b])
    assert _pages_alloc(log) == [(0, 2), (2, 1)], (
        "one pages_alloc event per request that took pages, as (uid, pages): expected [(0, "
        f"2), (2, 1)], got {_pages_alloc(log)}"
    )
    _advance(a, 10)  # a: positions 7..9 fill its last page and open a third
    _advance(b, 3)  # b: position 2 fits in its last page; it comes last in the batch
    a_before = cm.page_table[0, :7].tolist()
    log.clear()
    cm.allocate_paged([a, b])
    _assert_paged(cm.page_table[0, :10].tolist(), 4, "a")
    _assert_paged(cm.page_table[2, :3].tolist(), 4, "b")
    assert cm.page_table[0, :7].tolist() == a_before, (
        "positions below cached_len were written again"
    )
    for row, end in ((0, 10), (2, 3), (1, 0)):
        assert (cm.page_table[row, end:] == -1).all(), (
            f"row {row}: columns from {end} on were written, but only [cached_len, device_len) "
            "belong to this step"
        )
    assert _pages_alloc(log) == [(0, 1)], (
        "pages_alloc events as (uid, pages): only a took a page, expected [(0, 1)], got "
        f"{_pages_alloc(log)}"
    )
    assert cm.num_free_pages == 12, f"4 pages were needed, {16 - cm.num_free_pages} were taken"


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
            assert len(pages) == pages_for(req.cached_len, 4), (
                f"request {req.uid} holds extra pages"
            )
            for page in pages:
                assert page not in owner, (
                    f"page {page} is held by requests {owner.get(page)} and {req.uid}"
                )
                owner[page] = req.uid
    ref = hf_greedy(p, 9)
    assert_tokens_equal(
        [llm.results[u].token_ids for u in uids], [r[:n] for r, n in zip(ref, counts)]
    )
    assert llm.cache_manager.num_free_pages == llm.cache_manager.num_pages, (
        "the naive cache keeps nothing"
    )
    llm.cache_manager.check_integrity()


# ---------------------------------------------------------------- cache_req


def test_cache_req_shares_duplicates_and_frees_what_the_cache_does_not_take():
    cm = _manager(num_pages=16, page_size=4, cache_type="radix")
    prompt = list(range(20, 30))  # 10 tokens: 2 whole pages + 2 tokens
    a, b = _req(0, prompt), _req(1, prompt)
    cm.allocate_paged([a, b])  # prefilled side by side: both computed the whole prompt
    a.complete_one()
    b.complete_one()
    assert cm.num_free_pages == 16 - 3 - 3, (
        f"two prefills of 10 tokens need 3 + 3 pages, not {16 - cm.num_free_pages}"
    )

    cm.cache_req(a, finished=False)
    cache = cm.prefix_cache
    assert a.cache_handle.cached_len == 8, "only whole pages go to the cache"
    assert cache.protected_size == 8, "a running request's cached prefix must be locked"
    assert cm.num_free_pages == 10, "a's pages were new to the cache: nothing to free"

    b_row_before = cm.page_table[1, :10].clone()
    cm.cache_req(b, finished=False)
    assert cm.num_free_pages == 12, (
        "b's copy of the 2 cached pages is a duplicate and must be freed"
    )
    assert cm.page_table[1, :8].tolist() == cm.page_table[0, :8].tolist(), (
        "b must now use the cache's copy"
    )
    assert cm.page_table[1, 8:10].tolist() == b_row_before[8:10].tolist(), "b's own last page stays"
    assert b.cache_handle.cached_len == 8 and cache.protected_size == 8, (
        "b's handle covers the 8 shared tokens, locked once: handle "
        f"{b.cache_handle.cached_len}, locked {cache.protected_size}"
    )

    cm.cache_req(a, finished=True)
    assert cm.num_free_pages == 13, "a's partial last page goes back"
    assert cache.protected_size == 8, "b still runs on the shared prefix"
    assert a.cache_handle.cached_len == 0, (
        "a finished request holds no prefix any more: give it an empty handle"
    )
    cm.cache_req(b, finished=True)
    assert cm.num_free_pages == 14, (
        f"b's partial last page goes back: expected 14 free pages, got {cm.num_free_pages}"
    )
    assert (cache.protected_size, cache.evictable_size) == (0, 8), (
        f"both finished: 8 cached tokens, none locked (protected {cache.protected_size}, "
        f"evictable {cache.evictable_size})"
    )
    cm.check_integrity()


def test_requests_that_finish_at_their_prefill_free_their_duplicates_too():
    cm = _manager(num_pages=16, page_size=4, cache_type="radix")
    prompt = list(range(20, 30))
    # one token each: done at the prefill
    a, b = (
        _req(0, prompt, max_tokens=1),
        _req(1, prompt, max_tokens=1),
    )
    cm.allocate_paged([a, b])
    a.complete_one()
    b.complete_one()
    cm.cache_req(a, finished=True)
    cm.cache_req(b, finished=True)  # b's 2 whole pages duplicate a's: they go back too
    assert cm.num_free_pages == 14, (
        f"only a's 2 whole pages stay cached: expected 14 free pages, got {cm.num_free_pages}"
    )
    cm.check_integrity()


def test_cache_req_shares_the_cached_part_and_adds_the_rest_of_a_longer_prompt():
    cm = _manager(num_pages=16, page_size=4, cache_type="radix")
    cache = cm.prefix_cache
    prompt = list(range(20, 30))
    # b: a's 2 whole pages, then its own
    a, b = (
        _req(0, prompt),
        _req(1, prompt[:8] + list(range(50, 56))),
    )
    cm.allocate_paged([a, b])  # prefilled side by side: 3 + 4 pages
    a.complete_one()
    b.complete_one()
    cm.cache_req(a, finished=False)
    b_own = cm.page_table[1, 8:14].tolist()
    cm.cache_req(b, finished=False)
    assert cm.num_free_pages == 11, (
        "only b's copies of a's 2 pages are duplicates: expected 11 free pages, got "
        f"{cm.num_free_pages}"
    )
    assert cm.page_table[1, :8].tolist() == cm.page_table[0, :8].tolist(), (
        "b must now use the cache's copy of a's pages"
    )
    assert cm.page_table[1, 8:14].tolist() == b_own, "b's own pages stay where they are"
    assert b.cache_handle.cached_len == 12 and cache.protected_size == 12, (
        f"b's 3 whole pages are cached and locked: handle {b.cache_handle.cached_len}, locked "
        f"{cache.protected_size}"
    )
    cm.cache_req(a, finished=True)
    cm.cache_req(b, finished=True)
    assert cm.num_free_pages == 13, (
        "each request's partial last page goes back: expected 13 free pages, got "
        f"{cm.num_free_pages}"
    )
    cm.check_integrity()


def test_cache_req_marks_only_the_requests_own_prefix_as_used():
    cm = _manager(num_pages=32, page_size=1, cache_type="radix")
    for row, prompt in ((0, [1, 2, 3, 4, 5, 6]), (2, [9, 9])):  # two finished requests, a then c
        r = _req(row, prompt)
        cm.allocate_paged([r])
        r.complete_one()
        cm.cache_req(r, finished=True)
    a_tail = cm.page_table[0, 3:6].tolist()  # where a's tokens 4, 5, 6 are cached
    # computed its 3 prompt tokens beside the cached copy, and sampled token 4
    b = _req(1, [1, 2, 3])
    cm.allocate_paged([b])
    b.complete_one()
    b.append_host(torch.tensor([4]))
    cm.cache_req(b, finished=False)
    # b uses [1, 2, 3]; the rest of a's sequence, [4, 5, 6], was last used when a finished, before c
    got = sorted(cm.prefix_cache.evict(3).tolist())
    assert got == sorted(a_tail), (
        f"a's tokens 4, 5, 6 (locations {sorted(a_tail)}) are the least recently used: evicted "
        f"{got} instead"
    )


def test_cache_req_moves_the_lock_of_a_request_that_started_on_a_cached_prefix():
    cm = _manager(num_pages=16, page_size=4, cache_type="radix")
    cache = cm.prefix_cache
    prompt = list(range(20, 30))
    a = _req(0, prompt)
    cm.allocate_paged([a])
    a.complete_one()
    cm.cache_req(a, finished=True)  # leaves 2 whole pages (8 tokens) in the cache
    assert cm.num_free_pages == 14, (
        "a leaves 2 pages in the cache and frees 1: expected 14 free pages, got "
        f"{cm.num_free_pages}"
    )

    # c starts with a's 8 cached tokens, as the prefill adder admits it (chapter 10): matched and
    # locked
    c_ids = prompt[:8] + [40, 41, 42, 43, 44]
    handle, cached = cm.match_req(torch.tensor(c_ids, dtype=torch.int32))
    assert handle.cached_len == 8, f"a's 8 cached tokens should match, not {handle.cached_len}"
    cm.lock(handle)
    cm.page_table[1, :8] = cached
    c = Req(torch.tensor(c_ids, dtype=torch.int32), 1, 8, 8, 1, greedy(8), handle)
    cm.allocate_paged([c])  # positions 8..12: 2 pages
    c.complete_one()
    assert cm.num_free_pages == 12, (
        f"positions 8..12 need 2 new pages: expected 12 free pages, got {cm.num_free_pages}"
    )

    cm.cache_req(c, finished=False)
    assert cm.num_free_pages == 12, (
        "c's first 8 tokens are the cache's own copy, not duplicates: "
        f"{cm.num_free_pages - 12} page(s) freed"
    )
    assert cm.page_table[1, :8].tolist() == cached.tolist(), (
        "c's cached prefix must stay where it is"
    )
    assert c.cache_handle.cached_len == 12, "c's new handle covers its 3 whole pages"
    assert cache.protected_size == 12, (
        f"c runs on 12 cached tokens: all must be locked, once (protected {cache.protected_size})"
    )

    cm.cache_req(c, finished=True)
    assert cm.num_free_pages == 13, (
        f"only c's partial last page goes back: expected 13 free pages, got {cm.num_free_pages}"
    )
    assert (cache.protected_size, cache.evictable_size) == (0, 12), (
        f"c finished: all its locks must go (protected {cache.protected_size}, evictable "
        f"{cache.evictable_size})"
    )
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
        assert handle.cached_len == len(ids) + 5, (
            f"{len(ids)} + 6 tokens finished: {len(ids) + 5} should be cached, found "
            f"{handle.cached_len}"
        )
    assert cache.protected_size == 0, "nothing runs: nothing may stay locked"
    assert llm.cache_manager.num_free_pages + cache.size == llm.cache_manager.num_pages, (
        "with nothing running, every page is free or cached"
    )


# ---------------------------------------------------------------- check_integrity


def _used_llm(page_size: int = 1):
    llm = build_llm(page_size=page_size)
    llm.generate(prompt_ids(), greedy(4))
    llm.cache_manager.check_integrity()  # a healthy state passes
    return llm


def _cached_page(cm: CacheManager) -> torch.Tensor:
    return (cm.prefix_cache.all_indices()[:1] // cm.page_size).to(cm.free_pages.dtype)


def _assert_caught(cm: CacheManager, what: str) -> None:
    """check_integrity must raise an AssertionError that says what is wrong."""
    try:
        cm.check_integrity()
    except AssertionError as err:
        assert str(err).strip(), (
            f"check_integrity caught {what}, but its AssertionError has no message"
        )
        return
    raise AssertionError(f"check_integrity did not notice {what}")


@pytest.mark.parametrize("page_size", [1, 4])
def test_integrity_check_detects_a_leaked_page(page_size):
    cm = _used_llm(page_size).cache_manager
    cm.free_pages = cm.free_pages[1:]  # a page nobody owns any more
    _assert_caught(cm, "a page that is neither free nor cached (leaked)")


@pytest.mark.parametrize("page_size", [1, 4])
def test_integrity_check_detects_a_page_both_free_and_cached(page_size):
    cm = _used_llm(page_size).cache_manager
    # counts add up; one page is twice
    cm.free_pages = torch.cat([cm.free_pages[1:], _cached_page(cm)])
    _assert_caught(cm, "a page that is both free and in the prefix cache (the counts add up)")


def test_integrity_check_detects_a_page_freed_twice():
    cm = _used_llm().cache_manager
    cm.free_pages = torch.cat([cm.free_pages, _cached_page(cm)])  # one page too many
    _assert_caught(cm, "a cached page that was also freed")
    cm = _used_llm().cache_manager
    cm.free_pages = torch.cat([cm.free_pages[1:], cm.free_pages[1:2]])  # in the free list twice
    _assert_caught(cm, "a page that is in the free list twice (the counts add up)")


def test_integrity_check_detects_more_pages_than_the_pool_has():
    cm = _used_llm().cache_manager
    # not in the pool
    extra = torch.tensor([cm.num_pages], dtype=cm.free_pages.dtype, device=cm.free_pages.device)
    cm.free_pages = torch.cat([cm.free_pages, extra])  # no duplicate, nothing both free and cached
    _assert_caught(cm, "free + cached pages adding up to more than num_pages")


def test_integrity_check_detects_a_lock_left_behind():
    cm = _used_llm().cache_manager
    handle, _ = cm.match_req(torch.tensor(prompt_ids()[0], dtype=torch.int32))
    assert handle.cached_len > 0, "the prompt should be in the cache after the run"
    cm.lock(handle)  # as if a finished request had not released its lock
    _assert_caught(cm, "a prefix still locked with no request running")


def test_integrity_check_detects_a_broken_prefix_tree():
    cm = _used_llm().cache_manager
    node = next(iter(cm.prefix_cache.root.children.values()))
    node.ref_count = -1  # the tree's books are wrong, though free and cached pages still add up
    _assert_caught(cm, "a broken prefix cache (its own check_integrity fails)")


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
    assert not [e for e in log if e.kind == "reject"], (
        "requests that fit one at a time must not be refused"
    )
    assert llm.table_manager.available_size == llm.table_manager.capacity, (
        "every request slot must be free again"
    )
    llm.cache_manager.check_integrity()


def test_a_request_that_can_never_fit_is_refused_while_others_run():
    p = prompt_ids()
    n = 6
    num_pages = _small_pool(p, n, fits=1, page_size=1)
    llm = build_llm(num_page_override=num_pages)
    log = llm.events.record()
    huge = (p[3] * 8)[:num_pages]  # prompt + max_tokens is more than the whole pool

    uids = [llm.add_request(ids, greedy(n)) for ids in p[:2]]
    with refuses(
        ValueError, f"add_request of {len(huge)} tokens + {n}, over the pool", match="pages"
    ):
        llm.add_request(huge, greedy(n))
    with refuses(
        ValueError, "generate whose prompt 1 cannot fit the pool", match="prompt 1: .*pages"
    ):
        llm.generate([p[0], huge], greedy(n))
    # A frontend that did not check first: the scheduler itself must refuse it, and not crash.
    llm.io.put(
        UserMsg(
            uid=1000, input_ids=torch.tensor(huge, dtype=torch.int32), sampling_params=greedy(n)
        )
    )
    uids.append(llm.add_request(p[2], greedy(n)))
    llm.run_until_idle()

    rejects = [e for e in log if e.kind == "reject"]
    assert [e["uid"] for e in rejects] == [1000] and "pages" in rejects[0]["reason"], (
        "only the request that can never fit (uid 1000) should be refused, for lack of pages: "
        f"{rejects}"
    )
    errors = [m for e in log if e.kind == "send" for m in e["msgs"] if m.uid == 1000]
    assert len(errors) == 1 and errors[0].finished and errors[0].error, (
        "the refused request gets one finished error message"
    )
    assert 1000 not in {u for e in log if e.kind == "launch" for u in e["uids"]}, (
        "a refused request must never run"
    )
    assert_tokens_equal([llm.results[u].token_ids for u in uids], hf_greedy(p[:3], n))
    llm.cache_manager.check_integrity()
