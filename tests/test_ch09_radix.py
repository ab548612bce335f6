"""Chapter 9: the radix prefix cache.

Most tests drive `RadixPrefixCache` directly with made-up token ids and made-up KV locations (any
distinct integers will do: the tree only stores them). The last ones run the engine: a repeated
prompt is computed once, and eviction under memory pressure keeps outputs right.
"""

from __future__ import annotations

import random
from typing import Dict, List, Set, Tuple

import pytest
import torch

from contract_types import assert_dtype
from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prefill_batches, prompt_ids
from minisgl.kvcache import CacheHandle, RadixPrefixCache
from minisgl.scheduler import pages_for
from refusals import refuses

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("normal_loop")  # conftest.py: chapter 11 is not here yet


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def locs(start: int, n: int) -> torch.Tensor:
    """n made-up KV locations: start, start+1, ..."""
    return torch.arange(start, start + n, dtype=torch.int32)


def match(cache: RadixPrefixCache, *tokens: int) -> Tuple[int, List[int]]:
    handle, indices = cache.match_prefix(ids(*tokens))
    assert len(indices) == handle.cached_len, "match_prefix: one location per matched token"
    return handle.cached_len, indices.tolist()


# ---------------------------------------------------------------- insert, match, split


def test_insert_then_match_returns_the_inserted_locations():
    cache = RadixPrefixCache(1, CPU)
    assert match(cache, 1, 2, 3) == (0, []), "an empty cache matches nothing"
    values = locs(100, 5)
    prefix_len, handle = cache.insert_prefix(ids(1, 2, 3, 4, 5), values)
    values.fill_(-1)  # the caller's tensor is a view of a page-table row, which will be reused
    assert prefix_len == 0, "nothing was cached before"
    assert handle.cached_len == 5, "the handle covers the whole inserted sequence"
    assert cache.evictable_size == 5 and cache.protected_size == 0, (
        f"5 new tokens, unlocked: evictable {cache.evictable_size}, protected "
        f"{cache.protected_size}"
    )
    assert match(cache, 1, 2, 3, 4, 5) == (5, [100, 101, 102, 103, 104]), (
        "the cache must keep its own copy of the inserted locations"
    )
    assert match(cache, 1, 2, 3, 4, 5, 6, 7) == (5, [100, 101, 102, 103, 104]), (
        "a longer query matches what is there"
    )
    assert match(cache, 1, 2, 9) == (2, [100, 101]), (
        "[1, 2] agree, then 9 differs: the first 2 tokens match"
    )
    assert match(cache, 2, 3) == (0, []), "matching starts at the first token"
    cache.check_integrity()


def test_matching_inside_an_edge_splits_it_and_keeps_the_values_in_place():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), locs(100, 6))
    assert match(cache, 1, 2, 3, 9) == (3, [100, 101, 102]), (
        "[1, 2, 3] agree, then 9 differs: 3 tokens and their locations"
    )
    (upper,) = cache.root.children.values()
    assert upper.key == (1, 2, 3), "the match ended inside the edge: it must be split there"
    (lower,) = upper.children.values()
    assert lower.key == (4, 5, 6) and lower.value.tolist() == [103, 104, 105], (
        f"the lower half keeps [4, 5, 6] at 103..105: got {lower.key} at {lower.value.tolist()}"
    )
    assert cache.evictable_size == 6, "a split moves no tokens"
    assert match(cache, 1, 2, 3, 4, 5, 6) == (6, [100, 101, 102, 103, 104, 105]), (
        "after a split, the whole sequence still matches across both halves"
    )
    cache.check_integrity()


def test_a_match_that_ends_inside_a_page_splits_the_edge_at_the_page_start():
    cache = RadixPrefixCache(4, CPU)
    cache.insert_prefix(ids(*range(1, 13)), locs(40, 12))  # one edge of 3 pages
    assert match(cache, 1, 2, 3, 4, 5, 6, 99, 98) == (4, [40, 41, 42, 43]), (
        "6 tokens agree: one whole page"
    )
    upper = cache.root.children.get((1, 2, 3, 4))
    assert upper is not None and upper.key == (1, 2, 3, 4), (
        "the edge must be split after its first page"
    )
    (lower,) = upper.children.values()
    assert lower.key == tuple(range(5, 13)) and lower.value.tolist() == list(range(44, 52)), (
        "the lower half keeps the rest of the edge and its locations"
    )
    assert match(cache, *range(1, 11)) == (8, list(range(40, 48))), (
        "10 tokens agree: two whole pages"
    )
    assert [len(n.key) for n in (upper, *upper.children.values())] == [4, 4], (
        "the second match splits the lower half after one more page"
    )
    assert cache.evictable_size == 12, "a split moves no tokens"
    cache.check_integrity()


def test_a_diverging_insert_shares_the_common_prefix():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4, 5), locs(100, 5))
    prefix_len, handle = cache.insert_prefix(ids(1, 2, 3, 7, 8, 9), locs(200, 6))
    assert prefix_len == 3, (
        "the first 3 tokens were cached already (the caller's copies are duplicates)"
    )
    assert handle.cached_len == 6, "the handle covers all 6 tokens"
    assert match(cache, 1, 2, 3, 7, 8, 9) == (6, [100, 101, 102, 203, 204, 205]), (
        "the shared prefix keeps the first owner's locations; only the new suffix is added"
    )
    assert match(cache, 1, 2, 3, 4, 5) == (5, [100, 101, 102, 103, 104]), (
        "the first sequence is still cached as it was"
    )
    assert cache.evictable_size == 8, (
        f"5 + 3 new tokens are cached: evictable size {cache.evictable_size}"
    )
    prefix_len, handle = cache.insert_prefix(ids(1, 2, 3, 4), locs(300, 4))
    assert (prefix_len, handle.cached_len) == (4, 4), "all of it was cached: nothing to add"
    assert cache.evictable_size == 8, (
        f"nothing new was added: evictable size {cache.evictable_size}"
    )
    assert sorted(cache.all_indices().tolist()) == [100, 101, 102, 103, 104, 203, 204, 205], (
        "the tree holds the first sequence's locations and the second one's new suffix"
    )
    cache.check_integrity()


def test_only_whole_pages_are_matched_and_inserted():
    cache = RadixPrefixCache(4, CPU)
    # 10 tokens: 2 pages + 2
    prefix_len, handle = cache.insert_prefix(ids(*range(1, 11)), locs(40, 10))
    assert (prefix_len, handle.cached_len) == (0, 8), "the partial last page is not cached"
    assert cache.evictable_size == 8, (
        f"2 whole pages are cached: evictable size {cache.evictable_size}, expected 8"
    )
    assert match(cache, *range(1, 11)) == (8, list(range(40, 48))), (
        "all 10 tokens are there, but only the 2 whole pages match"
    )
    assert match(cache, *range(1, 8)) == (4, [40, 41, 42, 43]), (
        "7 tokens: only the first page matches"
    )
    assert match(cache, 1, 2, 3) == (0, []), "3 tokens are less than a page: nothing matches"
    assert match(cache, 1, 2, 3, 4, 5, 6, 99, 8) == (4, [40, 41, 42, 43]), (
        "a page that differs anywhere does not match"
    )

    # A sequence that leaves the cached one inside the second page branches at the page boundary.
    prefix_len, handle = cache.insert_prefix(ids(1, 2, 3, 4, 5, 6, 77, 88, 9), locs(80, 9))
    assert (prefix_len, handle.cached_len) == (4, 8), (
        f"the first page was cached, the second is new: got prefix_len {prefix_len}, handle "
        f"{handle.cached_len}"
    )
    assert match(cache, 1, 2, 3, 4, 5, 6, 77, 88) == (8, [40, 41, 42, 43, 84, 85, 86, 87]), (
        "the second sequence: the shared first page, then its own second page"
    )
    assert match(cache, *range(1, 9)) == (8, list(range(40, 48))), (
        "the first sequence's two pages are still there"
    )
    assert cache.evictable_size == 12, (
        f"3 distinct pages are cached: evictable size {cache.evictable_size}, expected 12"
    )
    for node in [cache.root.children[(1, 2, 3, 4)]] + list(
        cache.root.children[(1, 2, 3, 4)].children.values()
    ):
        assert len(node.key) % 4 == 0, f"edge {node.key} is not made of whole pages"
    cache.check_integrity()


# ---------------------------------------------------------------- locking and eviction


def _two_branches(page_size: int = 1) -> RadixPrefixCache:
    """root -> [1,2] -> {[3,4] (older), [5,6] (newer)} with locations 10.., 20.., 30.. (page_size 1)
    or the same shape with every token repeated page_size times."""

    def seq(*t):
        return ids(*[x for x in t for _ in range(page_size)])

    cache = RadixPrefixCache(page_size, CPU)
    cache.insert_prefix(
        seq(1, 2, 3, 4), torch.cat([locs(10, 2 * page_size), locs(20, 2 * page_size)])
    )
    cache.insert_prefix(
        seq(1, 2, 5, 6), torch.cat([locs(90, 2 * page_size), locs(30, 2 * page_size)])
    )
    return cache


def test_locks_move_tokens_between_evictable_and_protected():
    cache = _two_branches()
    assert (cache.evictable_size, cache.protected_size) == (6, 0), "6 tokens cached, none locked"
    handle, _ = cache.match_prefix(ids(1, 2, 5, 6))
    cache.lock_handle(handle)
    assert (cache.evictable_size, cache.protected_size) == (2, 4), (
        "the whole path to the root is protected"
    )
    cache.lock_handle(handle)  # a second request on the same prefix
    cache.lock_handle(handle, unlock=True)
    assert (cache.evictable_size, cache.protected_size) == (2, 4), "locks nest: one holder remains"
    other, _ = cache.match_prefix(ids(1, 2, 3))  # splits [3,4]: only [3] joins the protected part
    cache.lock_handle(other)
    assert (cache.evictable_size, cache.protected_size) == (1, 5), (
        "(evictable, protected) after locking [1,2,3] too: "
        f"{(cache.evictable_size, cache.protected_size)}"
    )
    cache.check_integrity()
    cache.lock_handle(handle, unlock=True)
    assert (cache.evictable_size, cache.protected_size) == (3, 3), (
        "(evictable, protected) after the last lock on [1,2,5,6] went: "
        f"{(cache.evictable_size, cache.protected_size)}"
    )
    cache.lock_handle(other, unlock=True)
    assert (cache.evictable_size, cache.protected_size) == (6, 0), (
        "(evictable, protected) with every lock released: "
        f"{(cache.evictable_size, cache.protected_size)}"
    )
    cache.lock_handle(CacheHandle(0))  # an empty match locks nothing
    assert (cache.evictable_size, cache.protected_size) == (6, 0), (
        "(evictable, protected): an empty handle changed them to "
        f"{(cache.evictable_size, cache.protected_size)}"
    )
    cache.check_integrity()


def test_unlocking_a_prefix_that_is_not_locked_is_an_error():
    cache = _two_branches()
    handle, _ = cache.match_prefix(ids(1, 2, 5, 6))
    cache.lock_handle(handle)
    cache.lock_handle(handle, unlock=True)
    try:
        # one unlock too many: a bookkeeping bug upstream of the cache
        cache.lock_handle(handle, unlock=True)
    except AssertionError:
        pass
    else:
        raise AssertionError(
            "unlocking a node whose ref_count is already 0 must raise an AssertionError"
        )


def test_evict_takes_least_recently_used_leaves_then_their_parent():
    cache = _two_branches()
    match(cache, 1, 2, 3, 4)  # now [5,6] is the least recently used leaf
    freed = cache.evict(2)
    assert sorted(freed.tolist()) == [30, 31], (
        "[5,6] is the least recently used leaf: it goes first"
    )
    # the locations as they were inserted: int32, the page table's and the free list's dtype
    assert_dtype(freed, torch.int32, "evict(2)'s freed locations")
    assert match(cache, 1, 2, 5, 6) == (2, [10, 11]), (
        "only the shared [1, 2] is left of that branch"
    )
    assert cache.evictable_size == 4, (
        f"2 of 6 tokens were evicted: evictable size {cache.evictable_size}, expected 4"
    )
    assert sorted(cache.evict(1).tolist()) == [20, 21], "eviction frees whole nodes"
    assert sorted(cache.evict(2).tolist()) == [10, 11], (
        "with its children gone, the parent is a leaf"
    )
    assert cache.evictable_size == 0 and cache.root.is_leaf, (
        "everything was evicted: the tree is empty"
    )
    assert cache.evict(0).numel() == 0, "evict(0) frees nothing"
    cache.check_integrity()


def _evicted(cache: RadixPrefixCache, n: int) -> List[int]:
    return sorted(cache.evict(n).tolist())


def test_evict_follows_the_order_of_last_use():
    cache = RadixPrefixCache(1, CPU)
    for t in range(1, 7):  # six leaves under the root: [t, t] at locations 10t, 10t + 1
        cache.insert_prefix(ids(t, t), locs(10 * t, 2))
    used = [4, 1, 6, 3, 5, 2]
    for t in used:
        match(cache, t, t)
    got = [min(_evicted(cache, 1), default=0) // 10 for _ in used]  # which leaf each evict(1) took
    assert got == used, f"leaves were last used in the order {used}, but evicted in the order {got}"
    cache.check_integrity()


def test_a_new_leaf_counts_as_just_used():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2), locs(10, 2))
    cache.insert_prefix(ids(3, 4), locs(20, 2))
    match(cache, 1, 2)  # [1,2] is used after [3,4] was inserted
    cache.insert_prefix(ids(5, 6), locs(30, 2))  # the newest entry of all
    got = [_evicted(cache, 2) for _ in range(3)]
    assert got == [[20, 21], [10, 11], [30, 31]], (
        f"eviction order: expected [3,4], [1,2], then the newly inserted [5,6]; got locations {got}"
    )


def test_a_match_stamps_every_node_it_passes_not_only_the_last():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), locs(10, 4))
    cache.insert_prefix(ids(1, 2, 5, 6), locs(20, 4))  # [1,2] is now shared by [3,4] and [5,6]
    cache.insert_prefix(ids(7, 8), locs(30, 2))
    held, _ = cache.match_prefix(ids(7, 8))
    cache.lock_handle(held)  # [7,8] cannot be evicted while the next match happens
    match(cache, 1, 2, 5, 6)  # used after [7,8]: the shared [1,2] and its branch [5,6]
    assert _evicted(cache, 2) == [12, 13], "[3,4], not matched since it was inserted, goes first"
    assert _evicted(cache, 2) == [22, 23], "then [5,6], the only unlocked leaf"
    cache.lock_handle(held, unlock=True)
    got = _evicted(cache, 2)
    assert got == [30, 31], (
        "[1,2], now a leaf, was passed by the match of [1,2,5,6], after [7,8] was last used: "
        f"[7,8] (locations 30, 31) is the least recently used, but evict took locations {got}; "
        "a walk stamps every node it passes with the new time, not only the one it ends on"
    )
    cache.check_integrity()


def test_the_lower_half_of_a_split_keeps_its_time_of_last_use():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), locs(10, 4))
    cache.insert_prefix(ids(7, 8), locs(20, 2))  # newer than [1,2,3,4]
    match(cache, 1, 2, 9)  # splits: [1,2] is used now; [3,4] was not matched
    assert _evicted(cache, 1) == [12, 13], (
        "[3,4] was not part of the match: it keeps its old time and is the least recently used leaf"
    )
    cache.check_integrity()


def test_a_parent_left_without_children_is_evicted_in_its_turn():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), locs(10, 4))
    match(cache, 1, 2, 9)  # splits: [1,2] is used now, [3,4] keeps its older time
    cache.insert_prefix(ids(7, 8), locs(20, 2))  # newer than [1,2]
    cache.insert_prefix(ids(5, 5), locs(30, 2))  # newer still
    got = _evicted(cache, 4)
    assert got == [10, 11, 12, 13], (
        "once [3,4] is gone, [1,2] is the least recently used leaf and goes next, before "
        f"[7,8]: evicted {got}"
    )
    cache.check_integrity()


def test_evicting_a_child_leaves_a_locked_parent_alone():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), locs(10, 4))
    handle, _ = cache.match_prefix(ids(1, 2))  # splits: [1,2] above [3,4]
    cache.lock_handle(handle)  # a request runs on [1,2]
    cache.insert_prefix(ids(7, 8), locs(20, 2))  # the newest leaf
    got = _evicted(cache, 3)
    assert got == [12, 13, 20, 21], (
        "[1,2] is locked: once its child is gone it is a leaf, but still no candidate "
        f"(evicted {got})"
    )
    assert match(cache, 1, 2) == (2, [10, 11]), "the locked [1, 2] stays cached"
    cache.check_integrity()


def test_evict_frees_whole_leaves_until_enough_is_free():
    cache = _two_branches(page_size=4)  # the parent [1,2] has two leaves of 8 locations each
    # one leaf is not enough; the parent is no leaf while the second one is there
    freed = cache.evict(9)
    assert sorted(freed.tolist()) == list(range(20, 28)) + list(range(30, 38)), (
        f"the two leaves go, whole, and not their parent: evicted {sorted(freed.tolist())}"
    )
    assert cache.evictable_size == 8, (
        f"the parent's 8 tokens remain evictable: evictable size {cache.evictable_size}"
    )
    assert match(cache, *[x for x in (1, 2, 3, 4) for _ in range(4)]) == (8, list(range(10, 18))), (
        "the other branch and the parent stay"
    )
    cache.check_integrity()


def test_a_locked_path_is_never_evicted():
    cache = _two_branches()
    handle, _ = cache.match_prefix(ids(1, 2, 3, 4))
    cache.lock_handle(handle)
    match(cache, 1, 2, 5, 6)  # the locked branch is now the least recently used one
    assert sorted(cache.evict(2).tolist()) == [30, 31], "the only evictable leaf is [5,6]"
    assert cache.evictable_size == 0, (
        f"everything left is locked: evictable size {cache.evictable_size}"
    )
    with refuses(RuntimeError, "evict(1) with everything left locked"):
        cache.evict(1)  # everything left is locked
    assert match(cache, 1, 2, 3, 4) == (4, [10, 11, 20, 21]), "the locked path stays cached"
    cache.lock_handle(handle, unlock=True)
    assert sorted(cache.evict(4).tolist()) == [10, 11, 20, 21], (
        "once unlocked, the path can be evicted"
    )
    cache.check_integrity()


def test_random_operations_keep_the_tree_consistent():
    rng = random.Random(7)
    for page_size in (1, 2):
        cache = RadixPrefixCache(page_size, CPU)
        held: Set[int] = set()  # the locations the cache should hold
        given: Dict[
            Tuple[int, ...], Set[int]
        ] = {}  # prefix -> locations ever inserted for its last token
        locked: List[CacheHandle] = []
        next_loc = 0
        for _ in range(300):
            seq = [rng.randint(1, 3) for _ in range(rng.randint(0, 12))]
            op = rng.random()
            if op < 0.4:
                values = locs(next_loc, len(seq))
                next_loc += len(seq)
                prefix_len, handle = cache.insert_prefix(ids(*seq), values)
                n = len(seq) - len(seq) % page_size
                assert handle.cached_len == n and prefix_len % page_size == 0, (
                    f"insert of {seq}: the handle covers its whole pages, and prefix_len is "
                    "whole pages"
                )
                held.update(values[prefix_len:n].tolist())
                for j in range(n):
                    given.setdefault(tuple(seq[: j + 1]), set()).add(int(values[j]))
            elif op < 0.65:
                handle, indices = cache.match_prefix(ids(*seq))
                assert handle.cached_len % page_size == 0 and len(indices) == handle.cached_len, (
                    f"match of {seq}: whole pages only, one location per matched token"
                )
                for j, loc in enumerate(indices.tolist()):
                    assert loc in given[tuple(seq[: j + 1])] and loc in held, (
                        "a match returned a wrong location"
                    )
                if rng.random() < 0.5:
                    cache.lock_handle(handle)
                    locked.append(handle)
            elif op < 0.8 and locked:
                cache.lock_handle(locked.pop(rng.randrange(len(locked))), unlock=True)
            elif cache.evictable_size:
                want = rng.randint(1, cache.evictable_size)
                freed = cache.evict(want).tolist()
                assert (
                    len(freed) >= want and set(freed) <= held and len(set(freed)) == len(freed)
                ), (
                    f"evict({want}) returned {len(freed)} locations: at least {want}, each "
                    "once, all of them cached"
                )
                held -= set(freed)
            cache.check_integrity()
            assert set(cache.all_indices().tolist()) == held, (
                "the tree holds exactly the locations inserted and not evicted"
            )
            assert cache.evictable_size + cache.protected_size == len(held), (
                "evictable + protected counts every cached token"
            )
        for handle in locked:
            cache.lock_handle(handle, unlock=True)
        assert cache.protected_size == 0, "every lock was released"
        cache.evict(cache.evictable_size)
        assert cache.all_indices().numel() == 0, "everything was evicted"


# ---------------------------------------------------------------- in the engine


def test_a_repeated_prompt_computes_only_its_last_token():
    llm = build_llm()
    p = prompt_ids()
    log = llm.events.record()
    first = llm.generate(p, greedy(6))
    (computed,) = prefill_batches(log)
    assert sorted(computed.values()) == sorted(len(x) for x in p), (
        "a fresh cache: every prompt token is computed"
    )

    log.clear()
    second = llm.generate(p, greedy(6))
    (computed,) = prefill_batches(log)
    assert list(computed.values()) == [1] * len(p), (
        "the whole prompt but its last token is cached: only that one should be computed"
    )
    ref = hf_greedy(p, 6)
    assert_tokens_equal([o["token_ids"] for o in first], ref)
    assert_tokens_equal([o["token_ids"] for o in second], ref)
    assert llm.cache_manager.prefix_cache.protected_size == 0, (
        "nothing runs: nothing may stay locked"
    )
    llm.cache_manager.check_integrity()


def test_a_running_requests_prompt_is_shared_with_one_that_arrives_later():
    llm = build_llm()
    p = prompt_ids()[0]
    log = llm.events.record()
    a = llm.add_request(p, greedy(10))
    llm.step()
    llm.step()  # a is prefilled and decoding: its prompt went into the cache at its prefill
    b = llm.add_request(p, greedy(3))
    llm.run_until_idle()
    assert prefill_batches(log)[-1] == {b: 1}, (
        f"b (a = {a}) should reuse the prompt of a running request"
    )
    assert_tokens_equal([llm.results[b].token_ids], hf_greedy([p], 3))
    llm.cache_manager.check_integrity()


def test_a_longer_prompt_reuses_the_cached_whole_pages_of_an_earlier_one():
    llm = build_llm(page_size=4)
    p = prompt_ids()
    earlier = max(p, key=len)
    later = earlier + p[0]  # the whole earlier prompt, then more
    llm.generate([earlier], greedy(6))
    log = llm.events.record()
    out = llm.generate([later], greedy(6))
    (computed,) = prefill_batches(log)
    reused = len(later) - list(computed.values())[0]
    assert reused >= len(earlier) // 4 * 4, (
        "every whole page of the earlier prompt should have been reused"
    )
    assert reused % 4 == 0 and reused < len(later), (
        f"only whole pages are reused, never the whole prompt: reused {reused} of {len(later)} "
        "tokens"
    )
    assert_tokens_equal([out[0]["token_ids"]], hf_greedy([later], 6))
    llm.cache_manager.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4])
def test_eviction_under_memory_pressure_keeps_outputs_right(page_size):
    p = prompt_ids()
    n = 6
    # The second set starts differently from the first, so it cannot reuse the first's cache.
    first, second = [p[0], p[1]], [p[3][1:] + p[1], p[1][2:] + p[3]]
    need = sum(pages_for(len(x) + n, page_size) for x in second)
    llm = build_llm(page_size=page_size, num_page_override=need + 1)
    cache = llm.cache_manager.prefix_cache

    out1 = llm.generate(first, greedy(n))
    done = [torch.tensor(x + o["token_ids"]) for x, o in zip(first, out1)]  # what the cache holds
    kept = [cache.match_prefix(x)[0].cached_len for x in done]
    assert sum(kept) > 0, "the first batch should have left its KV in the cache"
    out2 = llm.generate(second, greedy(n))  # does not fit beside what the cache holds
    llm.cache_manager.check_integrity()
    after = [cache.match_prefix(x)[0].cached_len for x in done]
    assert sum(after) < sum(kept), (
        "the second batch needed the cached pages: some should have been evicted"
    )
    out3 = llm.generate(first, greedy(n))  # partly recomputed now

    ref1, ref2 = hf_greedy(first, n), hf_greedy(second, n)
    assert_tokens_equal([o["token_ids"] for o in out1], ref1)
    assert_tokens_equal([o["token_ids"] for o in out2], ref2)
    assert_tokens_equal([o["token_ids"] for o in out3], ref1)
    llm.cache_manager.check_integrity()


def test_eviction_never_takes_the_prefix_of_a_running_request():
    p = prompt_ids()
    # Three prompts with different first tokens, so none reuses another's cache.
    a, c, b = p[0], p[1][2:] + p[3], p[3][1:]
    na, nc, nb = 20, 2, 3
    llm = build_llm(num_page_override=len(a) + na + len(c) + nc)  # a and c fit together, exactly
    cache = llm.cache_manager.prefix_cache
    log = llm.events.record()
    ua, uc = llm.add_request(a, greedy(na)), llm.add_request(c, greedy(nc))
    llm.step()
    # c is done; its KV stays in the cache, unlocked. a's prompt is cached too, but locked.
    llm.step()
    assert llm.results[uc].finished and not llm.results[ua].finished, (
        "c (2 tokens) should be done after two steps, a (20 tokens) still running"
    )
    done_c = torch.tensor(c + llm.results[uc].token_ids)
    before = cache.match_prefix(done_c)[0].cached_len
    # runs beside a only by evicting: a's prompt is the oldest entry
    ub = llm.add_request(b, greedy(nb))
    llm.run_until_idle()

    launched = [e["uids"] for e in log if e.kind == "launch"]
    assert any(ua in uids and ub in uids for uids in launched), (
        "b should have run while a was running"
    )
    ref = hf_greedy([a, c, b], na)
    assert_tokens_equal(
        [llm.results[u].token_ids for u in (ua, uc, ub)], [ref[0], ref[1][:nc], ref[2][:nb]]
    )
    llm.cache_manager.check_integrity()
    assert cache.match_prefix(done_c)[0].cached_len < before, (
        "the unlocked entry (c's KV) should have been evicted, not the prefix a running "
        "request reads"
    )
