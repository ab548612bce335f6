"""Chapter 4: where a token's keys and values live in the KV buffer, and the request slots (rows of
the page table and token pool) that the TableManager hands out."""

from __future__ import annotations

import pytest
import torch

from helpers import test_device
from minisgl.kvcache import KVCache, NaivePrefixCache
from minisgl.scheduler.table import TableManager
from minisgl.utils import EventLog
from refusals import refuses

LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 4


def make_cache(num_pages: int, page_size: int) -> KVCache:
    return KVCache(
        LAYERS, num_pages, page_size, KV_HEADS, HEAD_DIM, torch.float32, torch.device(test_device())
    )


# ---------------------------------------------------------------- the KV buffer


def test_buffer_shape_and_size():
    kv = make_cache(num_pages=5, page_size=4)
    want = (2, LAYERS, 5, 4, KV_HEADS, HEAD_DIM)
    assert tuple(kv.buffer.shape) == want, (
        f"buffer shape: expected {want}, got {tuple(kv.buffer.shape)}"
    )
    assert kv.num_locations == 20, f"5 pages of 4: expected 20 locations, got {kv.num_locations}"
    per_page = KVCache.bytes_per_page(LAYERS, 4, KV_HEADS, HEAD_DIM, torch.float32)
    assert per_page == 2 * LAYERS * 4 * KV_HEADS * HEAD_DIM * 4, f"bytes per page: got {per_page}"


@pytest.mark.parametrize("page_size", [1, 4])
def test_store_kv_writes_each_token_at_page_and_offset(page_size):
    kv = make_cache(num_pages=6, page_size=page_size)
    dev = kv.buffer.device
    locs = torch.tensor([5, 0, 13, 22], device=dev) % kv.num_locations
    k = torch.randn(len(locs), KV_HEADS, HEAD_DIM, device=dev)
    v = torch.randn(len(locs), KV_HEADS, HEAD_DIM, device=dev)
    kv.store_kv(k, v, locs, layer_id=1)
    for i, loc in enumerate(locs.tolist()):
        page, offset = divmod(loc, page_size)
        assert torch.equal(kv.buffer[0, 1, page, offset], k[i]), (
            f"K of token {i} is not at page {page}, offset {offset}"
        )
        assert torch.equal(kv.buffer[1, 1, page, offset], v[i]), (
            f"V of token {i} is not at page {page}, offset {offset}"
        )
    # nothing else changed: other layers, other locations
    written = torch.zeros(kv.num_locations, dtype=torch.bool, device=dev)
    written[locs] = True
    flat = kv.buffer.view(2, LAYERS, kv.num_locations, KV_HEADS, HEAD_DIM)
    assert flat[:, [0, 2]].abs().sum() == 0, "store_kv into layer 1 changed layer 0 or 2"
    assert flat[:, 1, ~written].abs().sum() == 0, (
        "store_kv changed a location of layer 1 that out_loc does not name"
    )


def test_k_cache_and_v_cache_are_views_by_location():
    kv = make_cache(num_pages=3, page_size=2)
    dev = kv.buffer.device
    k, v = (
        torch.randn(2, KV_HEADS, HEAD_DIM, device=dev),
        torch.randn(2, KV_HEADS, HEAD_DIM, device=dev),
    )
    kv.store_kv(k, v, torch.tensor([4, 1], device=dev), layer_id=2)
    assert torch.equal(kv.k_cache(2)[4], k[0]) and torch.equal(kv.v_cache(2)[1], v[1]), (
        "k_cache(2) / v_cache(2) at a location should read back what store_kv wrote there"
    )
    kv.k_cache(0)[3] = 7.0  # a view: writing through it changes the buffer
    assert bool((kv.buffer[0, 0, 1, 1] == 7.0).all()), (
        "k_cache(0)[3] should be a view of page 1, offset 1"
    )


def test_store_kv_overwrites_a_reused_location():
    kv = make_cache(num_pages=2, page_size=2)
    dev = kv.buffer.device
    loc = torch.tensor([3], device=dev)
    for value in (1.0, 2.0):
        kv.store_kv(
            torch.full((1, KV_HEADS, HEAD_DIM), value, device=dev),
            torch.full((1, KV_HEADS, HEAD_DIM), -value, device=dev),
            loc,
            layer_id=0,
        )
    assert bool((kv.buffer[0, 0, 1, 1] == 2.0).all()) and bool(
        (kv.buffer[1, 0, 1, 1] == -2.0).all()
    ), "a location written twice should hold the second K and V only"


# ---------------------------------------------------------------- request slots


def assert_refused(fn, *args) -> None:
    """`fn(*args)` must raise a RuntimeError of its own."""
    try:
        fn(*args)
    except NotImplementedError:
        raise  # a stub is not a refusal (NotImplementedError is a kind of RuntimeError)
    except RuntimeError:
        return
    pytest.fail(f"{fn.__name__}{args} should have raised RuntimeError")


def test_allocate_hands_out_distinct_rows():
    tm = TableManager(4)
    assert tm.capacity == 4 and tm.available_size == 4, "a fresh manager of 4 has 4 free rows"
    rows = [tm.allocate() for _ in range(4)]
    assert sorted(rows) == [0, 1, 2, 3], (
        f"4 allocations of 4 rows should give each row once, got {rows}"
    )
    assert tm.available_size == 0, (
        f"every row taken: expected available_size 0, got {tm.available_size}"
    )


def test_allocate_refuses_when_full():
    tm = TableManager(2)
    tm.allocate(), tm.allocate()
    assert_refused(tm.allocate)
    # the refusal changed nothing: a row freed now is the one handed out next
    tm.free(1)
    assert tm.allocate() == 1, (
        "after a refused allocate, freeing row 1 should make row 1 the one handed out"
    )


def test_a_fresh_manager_hands_out_row_0_first():
    row = TableManager(4).allocate()
    assert row == 0, f"a fresh manager should hand out row 0 first, got row {row}"


def test_the_row_freed_last_is_handed_out_next():
    # The free list is a stack: the row freed last is reused first, before rows freed earlier and
    # before rows never used.
    tm = TableManager(4)
    rows = [tm.allocate() for _ in range(3)]
    tm.free(rows[0]), tm.free(rows[2])
    row = tm.allocate()
    assert row == rows[2], (
        f"rows {rows[0]} then {rows[2]} were freed: expected row {rows[2]} next, got row {row}"
    )


def test_free_returns_a_row_for_reuse():
    tm = TableManager(3)
    a, b, c = tm.allocate(), tm.allocate(), tm.allocate()
    tm.free(b)
    assert tm.available_size == 1, (
        f"one row freed: expected available_size 1, got {tm.available_size}"
    )
    row = tm.allocate()
    assert row == b, f"row {b} is the only free row, got row {row}"
    tm.free(a), tm.free(c)
    assert tm.available_size == 2, (
        f"two rows freed: expected available_size 2, got {tm.available_size}"
    )
    got = {tm.allocate(), tm.allocate()}
    assert got == {a, c}, f"rows {a} and {c} were freed, got rows {got}"


def test_double_free_is_refused():
    tm = TableManager(3)
    row = tm.allocate()
    tm.free(row)
    assert_refused(tm.free, row)
    assert tm.available_size == 3, (
        f"the refused free should change nothing: available_size {tm.available_size}, not 3"
    )


@pytest.mark.parametrize("row", [1, -1, 3])
def test_freeing_a_row_never_allocated_is_refused(row):
    tm = TableManager(3)  # rows 0..2, all free
    assert_refused(tm.free, row)
    assert tm.available_size == 3, (
        f"the refused free should change nothing: available_size {tm.available_size}, not 3"
    )


def test_slot_events_name_the_row_and_request():
    log = EventLog()
    records = log.record()
    tm = TableManager(2, log)
    row = tm.allocate(uid=11)
    tm.free(row, uid=11)
    got = [(e.kind, e["table_idx"], e["uid"]) for e in records]
    want = [("slot_alloc", row, 11), ("slot_free", row, 11)]
    assert got == want, f"allocate(uid=11) then free: expected events {want}, got {got}"
    # a refused free or allocate changes nothing, so it reports nothing either
    tm.allocate(), tm.allocate()
    for call, args in ((tm.allocate, ()), (tm.free, (5,))):
        del records[:]
        assert_refused(call, *args)
        assert not records, (
            f"a refused {call.__name__} should emit no event, got {[e.kind for e in records]}"
        )


# ---------------------------------------------------------------- the naive prefix cache


def test_naive_prefix_cache_caches_nothing():
    cache = NaivePrefixCache(page_size=2, device=torch.device(test_device()))
    handle, indices = cache.match_prefix(torch.arange(10))
    assert handle.cached_len == 0 and indices.numel() == 0, "the naive cache should match nothing"
    prefix_len, handle = cache.insert_prefix(torch.arange(10), torch.arange(10))
    assert prefix_len == 0 and handle.cached_len == 0, "the naive cache should keep nothing"
    assert cache.size == 0 and cache.evict(0).numel() == 0, (
        "the naive cache should hold nothing to evict"
    )
    with refuses(RuntimeError, "the naive cache's evict(2), holding nothing"):
        cache.evict(2)
