"""Chapter 10: chunked prefill under a per-step token budget (`max_extend_tokens`).

Token counts per batch are read from the event log: each launch event carries how many new tokens
each request of the batch computes.
"""

from __future__ import annotations

from typing import List

import pytest
import torch

from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prefill_batches, prompt_ids
from minisgl.scheduler import (
    CacheManager,
    ChunkedReq,
    PendingReq,
    PrefillAdder,
    TableManager,
    pages_for,
)

pytestmark = pytest.mark.usefixtures("normal_loop")  # conftest.py: chapter 11 is not here yet


def material() -> List[int]:
    """All test prompts end to end: token ids to cut prompts of chosen lengths from."""
    return [t for ids in prompt_ids() for t in ids]


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("budget", [1, 3, 7, None])
def test_chunked_prefill_matches_hf(budget, page_size):
    options = {} if budget is None else {"max_extend_tokens": budget}
    llm = build_llm(page_size=page_size, **options)
    p = prompt_ids()
    out = llm.generate(p, greedy(6))
    assert_tokens_equal([o["token_ids"] for o in out], hf_greedy(p, 6), f"budget {budget}")
    # Prompts that continue cached ones: chunks that start after a cached prefix.
    more = [p[0] + p[3], p[3] + p[1]]
    out = llm.generate(more, greedy(6))
    assert_tokens_equal(
        [o["token_ids"] for o in out], hf_greedy(more, 6), f"budget {budget}, cached prefix"
    )
    assert llm.table_manager.available_size == llm.table_manager.capacity, (
        "every request slot must be free again"
    )
    llm.cache_manager.check_integrity()


# ---------------------------------------------------------------- the budget


def test_prefill_batches_share_the_budget_in_arrival_order():
    llm = build_llm(cache_type="naive", max_extend_tokens=7)
    m = material()
    prompts = [m[0:5], m[5:14], m[14:17], m[17:23]]
    log = llm.events.record()
    uids = [llm.add_request(x, greedy(4)) for x in prompts]
    llm.run_until_idle()
    a, b, c, d = uids
    want = [
        {a: 5, b: 2},  # a whole, then the start of b fills the budget
        {b: 7},  # b goes on: nobody overtakes it
        {c: 3, d: 4},  # b is done; c, then as much of d as fits
        {d: 2},
    ]
    got = prefill_batches(log)
    assert got == want, (
        "prefill batches as {uid: tokens}, budget 7, prompts of 5, 9, 3, 6 tokens: expected "
        f"{want}, got {got}"
    )
    assert_tokens_equal([llm.results[u].token_ids for u in uids], hf_greedy(prompts, 4))


@pytest.mark.parametrize("budget", [1, 3, 7])
def test_no_prefill_batch_exceeds_the_budget(budget):
    llm = build_llm(cache_type="naive", max_extend_tokens=budget)
    p = prompt_ids()
    log = llm.events.record()
    out = llm.generate(p, greedy(3))
    sizes = [sum(b.values()) for b in prefill_batches(log)]
    assert max(sizes) <= budget, f"prefill batches of {sizes} tokens with a budget of {budget}"
    assert sum(sizes) == sum(len(x) for x in p), "every prompt token is computed exactly once"
    assert all(n == budget for n in sizes[:-1]), (
        f"the budget should be filled while prompts wait: {sizes}"
    )
    assert_tokens_equal([o["token_ids"] for o in out], hf_greedy(p, 3))


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_long_prompt_is_split_and_answers_only_after_its_last_chunk(page_size):
    budget = 5
    llm = build_llm(page_size=page_size, max_extend_tokens=budget)
    long = material()
    log = llm.events.record()
    uid = llm.add_request(long, greedy(4))
    llm.run_until_idle()

    chunks = [
        i
        for i, e in enumerate(log)
        if e.kind == "launch" and e["phase"] == "prefill" and uid in e["uids"]
    ]
    assert len(chunks) == -(-len(long) // budget), f"{len(long)} tokens with a budget of {budget}"
    sends = [
        (i, m) for i, e in enumerate(log) if e.kind == "send" for m in e["msgs"] if m.uid == uid
    ]
    assert sends and sends[0][0] > chunks[-1], (
        "a request gets no message before its last chunk is computed"
    )
    assert [m.finished for _, m in sends] == [False, False, False, True], (
        "4 output tokens, only the last one finished: got finished flags "
        f"{[m.finished for _, m in sends]}"
    )
    assert_tokens_equal([[m.next_token for _, m in sends]], hf_greedy([long], 4))
    assert llm.results[uid].token_ids == [m.next_token for _, m in sends], (
        "the result holds the tokens sent"
    )
    llm.cache_manager.check_integrity()

    # the chapter's budget view reads the same log: the chunks, in order, cover the prompt once
    from classroom import chunks as view

    pieces = [p for step in view.loads(log) for p in step.pieces if p.uid == uid]
    sizes = [budget] * (len(long) // budget) + ([len(long) % budget] if len(long) % budget else [])
    assert [p.tokens for p in pieces] == sizes, (
        f"piece sizes: expected {sizes}, got {[p.tokens for p in pieces]}"
    )
    assert [p.start for p in pieces] == [budget * i for i in range(len(pieces))], (
        f"each piece starts where the previous one stopped: got starts {[p.start for p in pieces]}"
    )
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True], (
        "only the last piece is the last"
    )


# ---------------------------------------------------------------- PrefillAdder


def _parts(num_pages: int, cache_type: str = "naive", slots: int = 4, page_size: int = 1):
    table = TableManager(slots)
    cache = CacheManager(
        num_pages, page_size, torch.zeros(slots + 1, 64, dtype=torch.int32), cache_type
    )
    pool = torch.zeros(slots + 1, 64, dtype=torch.int32)
    return cache, table, pool


def _pending(uid: int, n: int, max_tokens: int = 2) -> PendingReq:
    return PendingReq(
        uid, torch.arange(10 * uid + 1, 10 * uid + 1 + n, dtype=torch.int32), greedy(max_tokens)
    )


def test_prefill_adder_chunks_the_request_that_hits_the_budget():
    cache, table, pool = _parts(64)
    a, b, c = _pending(1, 4), _pending(2, 9), _pending(3, 3)
    adder = PrefillAdder(6, 0, cache, table, pool, cache.page_table)
    ra = adder.try_add_one(a)
    assert (
        ra is not None and type(ra) is not ChunkedReq and (ra.cached_len, ra.device_len) == (0, 4)
    ), f"a's 4 tokens fit in the budget of 6: expected a normal request over 0..4, got {ra}"
    assert pool[ra.table_idx, :4].tolist() == a.input_ids.tolist(), (
        "the prompt goes into the token pool"
    )
    rb = adder.try_add_one(b)
    assert isinstance(rb, ChunkedReq), "b does not fit in what is left of the budget: it is chunked"
    assert (rb.cached_len, rb.device_len) == (0, 2) and b.chunked_req is rb, (
        "b's first chunk covers the 2 tokens of budget left, and is remembered in "
        f"b.chunked_req: got {rb}"
    )
    assert pool[rb.table_idx, :9].tolist() == b.input_ids.tolist(), (
        "the whole prompt is stored at once"
    )
    rc = adder.try_add_one(c)
    assert rc is None, (
        f"the budget of 6 is spent (a's 4 tokens and b's first 2, budget left "
        f"{adder.token_budget}): c must wait, got {rc}"
    )
    assert table.available_size == 2, "a request that waits must not hold a slot"

    rb.complete_one()  # the engine ran the chunk
    rb2 = PrefillAdder(4, 0, cache, table, pool, cache.page_table).try_add_one(b)
    assert isinstance(rb2, ChunkedReq) and (rb2.cached_len, rb2.device_len) == (2, 6), (
        f"with a budget of 4, b's second chunk covers positions 2..6: got {rb2}"
    )
    assert rb2.table_idx == rb.table_idx and b.chunked_req is rb2, (
        "a continued chunk keeps its slot and is remembered"
    )
    rb2.complete_one()
    rb3 = PrefillAdder(100, 0, cache, table, pool, cache.page_table).try_add_one(b)
    assert type(rb3) is not ChunkedReq, "the last piece is a normal request: it will decode"
    assert (rb3.cached_len, rb3.device_len, rb3.max_device_len) == (6, 9, 11), (
        f"b's last piece covers positions 6..9 of its 9 + 2 tokens: got {rb3}"
    )
    assert rb3.table_idx == rb.table_idx and b.chunked_req is None, (
        "the last piece keeps the slot and clears chunked_req"
    )
    assert table.available_size == 2, "a continued chunk keeps its slot"


def test_prefill_adder_admits_only_what_memory_can_finish():
    cache, table, pool = _parts(12)
    # running requests may need 4 pages
    adder = PrefillAdder(100, 4, cache, table, pool, cache.page_table)
    assert adder.try_add_one(_pending(1, 4, max_tokens=4)) is not None, (
        "4 + 4 tokens need 8 pages, beside the 4 reserved in a pool of 12: it fits exactly"
    )
    assert adder.try_add_one(_pending(2, 1, max_tokens=1)) is None, (
        "no page left for its whole life"
    )
    assert table.available_size == 3, "a request that waits must not hold a slot"

    table2 = TableManager(1)
    adder = PrefillAdder(100, 0, cache, table2, pool, cache.page_table)
    assert adder.try_add_one(_pending(1, 2)) is not None, (
        "one slot is free: the first request gets it"
    )
    assert adder.try_add_one(_pending(2, 2)) is None, "no request slot left"


def test_a_continued_chunk_keeps_its_reservation():
    cache, table, pool = _parts(12)
    b = _pending(2, 9)  # 9 + 2 tokens: 11 pages for its whole life
    rb = PrefillAdder(2, 0, cache, table, pool, cache.page_table).try_add_one(b)
    cache.allocate_paged([rb])
    rb.complete_one()  # its first chunk ran: 2 pages used, 10 free
    adder = PrefillAdder(100, 0, cache, table, pool, cache.page_table)
    # it may still need 9 pages
    assert adder.try_add_one(b) is not None, "b goes on: it was admitted when its first chunk ran"
    assert adder.try_add_one(_pending(3, 1, max_tokens=1)) is None, (
        "it would take pages promised to b"
    )


@pytest.mark.parametrize("page_size,num_pages", [(1, 13), (4, 4)])
def test_a_continued_chunk_reserves_exactly_what_it_may_still_need(page_size, num_pages):
    for pages, fits in ((num_pages, True), (num_pages - 1, False)):
        cache, table, pool = _parts(pages, page_size=page_size)
        b = _pending(2, 9)  # 9 + 2 tokens for its whole life
        rb = PrefillAdder(2, 0, cache, table, pool, cache.page_table).try_add_one(b)
        assert rb is not None, (
            f"{pages} pages of {page_size} tokens, all free: b (9 + 2 tokens) must be admitted"
        )
        cache.allocate_paged([rb])
        rb.complete_one()  # its first chunk ran: 2 tokens computed
        left = pages_for(11, page_size) - pages_for(2, page_size)
        adder = PrefillAdder(100, 0, cache, table, pool, cache.page_table)
        assert adder.try_add_one(b) is not None, "b's next piece needs no new admission"
        got = adder.try_add_one(_pending(3, 1, max_tokens=1))  # needs 1 page, beside b's `left`
        free = cache.num_free_pages
        assert (got is not None) == fits, (
            f"pages of {page_size}: b may still need {left} pages and the newcomer 1, with "
            f"{free} free: " + ("it fits exactly and must be admitted" if fits else "it must wait")
        )


def test_a_prompt_of_exactly_the_budget_is_one_piece():
    cache, table, pool = _parts(64)
    adder = PrefillAdder(5, 0, cache, table, pool, cache.page_table)
    a = _pending(1, 5)
    ra = adder.try_add_one(a)
    assert type(ra) is not ChunkedReq and (ra.cached_len, ra.device_len) == (0, 5), (
        "a prompt of exactly the budget fits whole: it is a normal request, not a chunk"
    )
    assert a.chunked_req is None, "a's whole prompt was added: it has no chunk pending"
    rb = adder.try_add_one(_pending(2, 1))
    assert rb is None, (
        f"the budget of 5 is spent by a's 5 tokens (budget left {adder.token_budget}): nothing "
        f"more joins this batch, got {rb}"
    )
    assert table.available_size == 3, "a request that waits must not hold a slot"

    b = _pending(3, 6)  # one token more than the budget
    rb = PrefillAdder(5, 0, cache, table, pool, cache.page_table).try_add_one(b)
    assert isinstance(rb, ChunkedReq) and (rb.cached_len, rb.device_len) == (0, 5), (
        "a prompt of budget + 1 tokens: a chunk of the budget first"
    )
    rb.complete_one()
    rb2 = PrefillAdder(5, 0, cache, table, pool, cache.page_table).try_add_one(b)
    assert type(rb2) is not ChunkedReq and (rb2.cached_len, rb2.device_len) == (5, 6), (
        "then its last token, as a normal request"
    )


def _promised_pages(llm) -> int:
    """Pages the admitted requests may still ask for: running ones up to max_tokens, and prompts
    part-way through a chunked prefill up to their whole life."""
    p = llm.cache_manager.page_size
    running = sum(
        pages_for(r.max_device_len, p) - pages_for(r.cached_len, p)
        for r in llm.decode_manager.running.values()
    )
    chunked = sum(
        pages_for(q.total_len, p) - pages_for(q.chunked_req.cached_len, p)
        for q in llm.prefill_manager.pending
        if q.chunked_req is not None
    )
    return running + chunked


def _run_checking_admission(llm, limit: int = 500) -> None:
    """Run until idle; after every step, what admitted requests may still need must fit in
    memory."""
    for step in range(limit):
        if not llm.busy:
            return
        try:
            llm.step()
        except RuntimeError as err:
            if "evict" not in str(err) and "out of KV pages" not in str(err):
                raise
            raise AssertionError(
                f"step {step}: the pool ran out of pages in the middle of a request: a request "
                "was admitted whose prompt + max_tokens did not fit beside what the others "
                "may still need"
            ) from None
        promised, available = _promised_pages(llm), llm.cache_manager.available_pages
        assert promised <= available, (
            f"after step {step}: admitted requests may still need {promised} pages, but only "
            f"{available} "
            "are free or evictable: a request was admitted that memory cannot finish"
        )
    raise AssertionError(f"the requests did not finish in {limit} steps")


@pytest.mark.parametrize("cache_type,page_size", [("naive", 1), ("radix", 4)])
def test_admitted_requests_can_always_finish(cache_type, page_size):
    p = prompt_ids()
    # running requests may still ask for many pages: admitting a newcomer must leave them room
    n = 20
    prompts = [p[0], p[1], p[3], p[0] + p[3], p[2], p[1]]
    need = max(pages_for(len(x) + n, page_size) for x in prompts)
    # about two requests fit at a time; a step's budget holds parts of two or three prompts
    llm = build_llm(
        cache_type=cache_type, page_size=page_size, num_page_override=2 * need, max_extend_tokens=24
    )
    log = llm.events.record()
    uids = [llm.add_request(x, greedy(n)) for x in prompts]
    _run_checking_admission(llm)
    running = max(len(e["uids"]) for e in log if e.kind == "launch" and e["phase"] == "decode")
    assert running < len(prompts), "the pool cannot hold every request: some must have waited"
    assert_tokens_equal([llm.results[u].token_ids for u in uids], hf_greedy(prompts, n))
    llm.cache_manager.check_integrity()


def test_a_waiting_request_is_not_overtaken():
    p = prompt_ids()
    big, small = p[0] * 2, p[3][:3]
    llm = build_llm(cache_type="naive", num_page_override=len(big) + 12)
    log = llm.events.record()
    first = llm.add_request(p[3], greedy(4))  # holds pages, so `big` must wait for them
    llm.step()
    b = llm.add_request(big, greedy(4))
    s = llm.add_request(small, greedy(2))  # would fit beside `first`, but came after `big`
    _run_checking_admission(llm)
    order = [uid for batch in prefill_batches(log) for uid in batch]
    assert order.index(b) < order.index(s), (
        f"prefill order {order} (first {first}): a later request overtook"
    )


def test_prefill_adder_uses_and_locks_the_cached_prefix():
    cache, table, pool = _parts(32, cache_type="radix")
    prompt = torch.arange(1, 9, dtype=torch.int32)
    cached_locs = cache.free_pages[-5:].clone()  # pretend an earlier request left 5 tokens' KV
    cache.free_pages = cache.free_pages[:-5]
    cache.prefix_cache.insert_prefix(prompt[:5], cached_locs)

    req = PrefillAdder(2, 0, cache, table, pool, cache.page_table).try_add_one(
        PendingReq(1, prompt, greedy(3))
    )
    assert isinstance(req, ChunkedReq) and (req.cached_len, req.device_len) == (5, 7), (
        "computation starts after the cached prefix; the budget of 2 covers tokens 5 and 6"
    )
    assert cache.page_table[req.table_idx, :5].tolist() == cached_locs.tolist(), (
        "the cached prefix's locations go into the request's page-table row"
    )
    assert cache.prefix_cache.protected_size == 5, "the prefix in use must be locked"

    cache.unlock(req.cache_handle)  # (as if it had been aborted)
    # 27 free pages and the 5 cached ones; the prompt needs 8 + 3 - 5 = 6 pages beyond its cached
    # prefix, and the prefix it locks is no longer evictable: 6 + 21 reserved is exactly the 27 free
    # pages.
    short = PrefillAdder(100, 22, cache, table, pool, cache.page_table)
    assert short.try_add_one(PendingReq(2, prompt, greedy(3))) is None, (
        "6 pages + 22 reserved > 27 free: the locked prefix does not count as evictable"
    )
    assert cache.prefix_cache.protected_size == 0, "a request that waits must not keep a lock"
    assert table.available_size == 3, "a request that waits must not hold a slot"
    exact = PrefillAdder(100, 21, cache, table, pool, cache.page_table)
    assert exact.try_add_one(PendingReq(3, prompt, greedy(3))) is not None, (
        "6 pages beyond the cached prefix + 21 reserved = 27 free pages: it fits exactly"
    )
    assert cache.prefix_cache.protected_size == 5, "the prefix in use must be locked"
