"""Chapter 25: the cache-aware router's parts (minisgl/router), judged in-process, no worker needed.

- `PrefixTree.match`: the longest prefix of a key the tree holds, stopping where an edge disagrees;
  every node walked marked used;
- `PrefixTree.insert`: a key added with each element stored once (an edge left midway is split);
- `PrefixTree.evict`: whole least recently used leaves go until the tree is within its bound;
- `cache_aware`: SGLang's rule: load first when imbalanced, else the longest match past the cache
  threshold, else the smallest tree; ties to the first worker.

A `WorkerPool` (the router's own routing, minus HTTP) puts them together on a tenant workload.
"""

from __future__ import annotations

import random
from typing import Dict, List

from minisgl.router.policy import Balance, cache_aware
from minisgl.router.tree import Node, PrefixTree
from minisgl.router.workers import WorkerPool
from refusals import refuses

BAL = Balance(abs_threshold=4, rel_threshold=2.0, cache_threshold=0.5)


def tree_of(*keys) -> PrefixTree:
    t = PrefixTree()
    for key in keys:
        t.insert(key)
    return t


def edges(node: Node) -> Dict:
    """The tree below `node` as nested {edge: {...}}, so a failure shows its shape."""
    return {
        (c.edge if isinstance(c.edge, str) else tuple(c.edge)): edges(c)
        for c in node.children.values()
    }


def path_nodes(t: PrefixTree, key) -> List[Node]:
    """The nodes a walk along `key` passes (found without the tree's own methods)."""
    node, i, seen = t.root, 0, []
    while i < len(key) and key[i] in node.children:
        node = node.children[key[i]]
        seen.append(node)
        i += len(node.edge)
    return seen


def newest(t: PrefixTree) -> int:
    """The largest last_used of any node: the tick of the latest walk."""
    stack, best = [t.root], t.root.last_used
    while stack:
        node = stack.pop()
        best = max(best, node.last_used)
        stack.extend(node.children.values())
    return best


# --- match --------------------------------------------------------------------------------------


def test_match_is_the_longest_prefix_any_inserted_key_shares():
    t = tree_of("hello world", "hello there")
    for key, want in [
        ("hello wo", 8),
        ("hello world and more", 11),
        ("hello there", 11),
        ("help", 3),
        ("xyz", 0),
        ("", 0),
        ("hello ", 6),
    ]:
        got = t.match(key)
        assert got == want, f"match({key!r}) over 'hello world', 'hello there': {want}, got {got}"


def test_a_match_stops_where_the_key_leaves_an_edge():
    # "abcd" with a child "e": the key "abe" leaves the edge "abcd" after 2; the "e" hanging
    # below that edge is not a prefix of it
    t = tree_of("abcd", "abcde")
    assert edges(t.root) == {"abcd": {"e": {}}}
    got = t.match("abe")
    assert got == 2, f"match('abe') over 'abcd' -> 'e': 2 (stops inside 'abcd'), got {got}"
    assert t.match("abcdx") == 4 and t.match("abcde") == 5 and t.match("abcdef") == 5
    # nor does it go on from the parent: a sibling that starts with the key's next element
    # continues another edge, not the part of "abcd" matched
    t.insert("exyz")
    got = t.match("abexy")
    assert got == 2, f"match('abexy') over 'abcd' -> 'e' and 'exyz': 2, got {got}"


def test_a_match_changes_neither_the_shape_nor_the_size():
    t = tree_of("abcdef", "abcxyz")
    shape, size = edges(t.root), t.size
    for key in ("abc", "ab", "abcdef", "abq", "abcxy", "q", ""):
        t.match(key)
        assert edges(t.root) == shape and t.size == size, f"match({key!r}) changed the tree"


def test_a_match_marks_every_node_it_walks_used_the_partly_matched_one_too():
    t = tree_of("abcdef", "abcxyz", "qrs")
    t.match("abcxy")  # ends inside the edge "xyz"
    now = newest(t)
    walked = path_nodes(t, "abcxyz")
    assert [n.edge for n in walked] == ["abc", "xyz"]
    stamps = [n.last_used for n in walked]
    assert stamps == [now, now], f"the nodes walked ('abc', 'xyz') carry {stamps}, not {now}"
    others = [n.last_used for n in path_nodes(t, "abcdef")[1:] + path_nodes(t, "qrs")]
    assert all(s < now for s in others), f"a node off the walk was marked used: {others}"
    t.match("zzz")  # touches nothing, but a later walk must still be newer
    t.match("qr")
    assert path_nodes(t, "qrs")[0].last_used > now, "each match takes a fresh tick"


def test_token_id_keys_and_text_keys_share_nothing():
    t = tree_of((1, 2, 3, 4))
    assert t.match((1, 2, 3, 9)) == 3 and t.match((7,)) == 0
    assert t.match("abc") == 0
    t.insert("ab")
    assert t.match((1, 2)) == 2 and t.match("abc") == 2 and t.size == 6


# --- insert -------------------------------------------------------------------------------------


def test_insert_returns_what_was_there_and_counts_each_element_once():
    t = PrefixTree()
    assert t.insert("hello world") == 0 and t.size == 11
    assert t.insert("hello there") == 6  # "hello " was there
    assert t.size == len("hello ") + len("world") + len("there")
    assert edges(t.root) == {"hello ": {"world": {}, "there": {}}}
    assert t.insert("hello world") == 11 and t.size == 16, "a key already held adds nothing"
    assert t.insert("") == 0 and t.size == 16
    assert t.match("hello world") == 11 and t.match("hello there") == 11


def test_a_key_inside_an_edge_splits_it_and_adds_nothing():
    t = tree_of("abcdef")
    assert t.insert("abc") == 3
    assert t.size == 6, f"'abc' inside 'abcdef' is held already: size 6, got {t.size}"
    assert edges(t.root) == {"abc": {"def": {}}}, f"split at 'abc': got {edges(t.root)}"
    assert t.match("abcdef") == 6 and t.match("abcx") == 3
    assert t.insert("abcxyz") == 3 and t.size == 9
    assert edges(t.root) == {"abc": {"def": {}, "xyz": {}}}
    assert t.match("abcxy") == 5 and t.match("abdef") == 2 and t.match("axyz") == 1


def test_a_key_that_leaves_an_edge_midway_splits_it_there():
    t = tree_of((1, 2, 3, 4, 5))
    assert t.insert((1, 2, 9)) == 2 and t.size == 6
    assert edges(t.root) == {(1, 2): {(3, 4, 5): {}, (9,): {}}}
    inner = t.root.children[1]
    assert all(c.parent is inner for c in inner.children.values()), "children point to the split"
    assert inner.parent is t.root
    assert t.match((1, 2, 3, 4, 5, 6)) == 5 and t.match((1, 2, 9, 9)) == 3


def test_insert_marks_every_node_on_the_path_used():
    t = tree_of("shared:tenant-a", "shared:tenant-b", "other")
    t.insert("shared:tenant-a")  # all there: only the marks change
    now = newest(t)
    stamps = [n.last_used for n in path_nodes(t, "shared:tenant-a")]
    assert stamps and all(s == now for s in stamps), f"the path carries {stamps}, not {now}"
    leaf_b = path_nodes(t, "shared:tenant-b")[-1]
    assert leaf_b.last_used < now
    t.insert("shared:tenant-c")  # splits nothing new above, adds a leaf: all marked now
    now = newest(t)
    stamps = [n.last_used for n in path_nodes(t, "shared:tenant-c")]
    assert all(s == now for s in stamps), f"the new path carries {stamps}, not {now}"


def test_a_split_keeps_the_lower_half_and_marks_the_upper_used():
    t = tree_of("abcdef", "zz")
    t.insert("abcxyz")
    now = newest(t)
    upper = t.root.children["a"]
    lower = upper.children["d"]
    assert upper.last_used == now and upper.children["x"].last_used == now
    assert lower.last_used < now, "the old half of a split was not walked by this insert"


# --- evict --------------------------------------------------------------------------------------


def test_evict_drops_least_recently_used_leaves_whole_until_within_size():
    a, b = "shared-system-prompt:tenant-a", "shared-system-prompt:tenant-b"
    t = tree_of(a, b, "other")
    t.match(a)  # a is used again: b's leaf (its last character) and "other" are older
    size = t.size
    got = t.evict(size - 1)
    assert got == 1, f"the oldest leaf is b's 'b' (1 element): removed {got}"
    assert t.size == size - 1 and t.match(b) == len(b) - 1 and t.match("other") == 5
    t.match(a)
    got = t.evict(size - 2)
    assert got == len("other"), f"now 'other' is the oldest leaf, 5 elements: removed {got}"
    assert t.match("other") == 0 and t.match(a) == len(a) and t.size == len(a)
    assert t.evict(len(a)) == 0 and t.size == len(a), "within the bound nothing goes"
    assert t.evict(0) == len(a) and t.size == 0 and t.match("shared") == 0
    assert t.root.children == {}


def test_evict_removes_a_whole_leaf_even_past_the_bound():
    t = tree_of("aaaaaaaaaa", "bbbbbbbbbb")
    got = t.evict(19)  # one element too many: the oldest leaf goes whole, not one element of it
    assert got == 10 and t.size == 10, f"removed {got}, size {t.size}: a leaf goes whole"
    assert t.match("aaaaaaaaaa") == 0 and t.match("bbbbbbbbbb") == 10


def test_evict_takes_nothing_more_than_needed():
    t = tree_of("aaa", "bbb", "ccc", "ddd")
    t.match("ccc")
    assert t.evict(6) == 6 and t.size == 6
    assert t.match("aaa") == 0 and t.match("bbb") == 0
    assert t.match("ccc") == 3 and t.match("ddd") == 3


def test_evict_queues_a_parent_left_without_children_in_its_turn():
    t = tree_of("aaaa-b", "aaaa-c", "zzz")
    t.match("zzz")  # newer than the "aaaa-" branch
    got = t.evict(3)
    assert got == 7 and t.size == 3, f"'b', 'c', then their parent 'aaaa-' go: removed {got}"
    assert edges(t.root) == {"zzz": {}}
    t = tree_of("aaaa-b", "aaaa-c")
    assert t.evict(0) == 7 and t.size == 0 and t.root.children == {}


def test_an_emptied_parent_goes_in_the_order_of_its_own_last_use():
    # the parent "p-" is used more recently than its two leaves: once they are gone it is a leaf
    # and waits its turn by its own last use, after "mid"
    t = tree_of("p-1", "p-2", "mid", "late")
    t.match("p-")  # the parent is newer than "mid" now, its leaves are not
    got = t.evict(t.size - 2)  # the two leaves "1" and "2" go first
    assert got == 2 and edges(t.root) == {"p-": {}, "mid": {}, "late": {}}
    got = t.evict(t.size - 1)  # then "mid" (older than the parent), not the parent
    assert got == 3 and edges(t.root) == {"p-": {}, "late": {}}, f"got {edges(t.root)}"


def test_a_tree_within_its_bound_is_left_alone_without_a_walk():
    # the pool calls evict after every request: within the bound it must cost nothing
    t = tree_of("abc", "abd", "xyz")
    shape = edges(t.root)

    def no_walk():
        raise AssertionError("evict walked the tree although it was within its bound")

    t._nodes = no_walk
    for bound in (t.size, t.size + 1, 1 << 22):
        got = t.evict(bound)
        assert got == 0 and edges(t.root) == shape, f"evict({bound}) of a tree of {t.size}: {got}"


def test_random_inserts_matches_and_evictions_keep_the_size_true():
    """After each step the size is what the tree holds, every key a match finds is a real prefix
    of some key still held, and eviction removes exactly what it returns."""
    rng = random.Random(25)
    for _ in range(60):
        t, keys = PrefixTree(), []
        for _ in range(40):
            if rng.random() < 0.6:
                key = rng.choice(["p-", "p-q", "pq", "x", ""]) + "".join(
                    rng.choice("ab") for _ in range(rng.randint(0, 4))
                )
                t.insert(key)
                keys.append(key)
            elif rng.random() < 0.5 and keys:
                t.match(rng.choice(keys))
            else:
                size, bound = t.size, rng.randint(0, max(t.size - 1, 0))
                got = t.evict(bound)
                assert t.size <= bound or t.size == 0, f"evict({bound}) left {t.size}"
                assert got == size - t.size, (
                    f"evict({bound}) returned {got}, the size fell by {size - t.size}"
                )
            held = sum(len(n.edge) for n in t._nodes())
            assert t.size == held, (
                f"size {t.size}, but the tree holds {held} elements: {edges(t.root)}"
            )
            for key in keys:
                n = t.match(key)
                assert n == 0 or any(k.startswith(key[:n]) for k in keys)


def test_evict_refuses_a_negative_bound():
    t = tree_of("abc")
    with refuses(ValueError, "evict(-1)", match="max_size"):
        t.evict(-1)
    assert t.size == 3


# --- cache_aware --------------------------------------------------------------------------------


def test_imbalance_needs_both_thresholds():
    cases = [  # loads, then the worker chosen: 0 holds the whole key, so only imbalance moves it
        ([4, 0], 0),  # 4 apart is not past 4
        ([5, 0], 1),  # 5 apart and 5 > 0 x 2: imbalanced, the least loaded
        ([15, 10], 0),  # 5 apart but 15 is not past 2 x 10
        ([20, 10], 0),  # 10 apart but 20 is not past 2 x 10
        ([21, 10], 1),
        ([3, 1], 0),  # 3 times as busy, but only 2 apart
        ([5, 2], 0),  # 2.5 times as busy, but 3 apart (the difference, not the busiest's load)
    ]
    for loads, want in cases:
        got = cache_aware([10, 0], 10, loads, [10, 0], BAL)
        assert got == want, f"loads {loads} (thresholds 4 apart, 2x): worker {want}, got {got}"


def test_imbalanced_the_least_loaded_wins_whatever_it_holds():
    got = cache_aware([2, 10, 0], 10, [1, 9, 2], [50, 40, 10], BAL)
    assert got == 0, f"loads [1, 9, 2] are imbalanced: the least loaded, worker 0, got {got}"
    got = cache_aware([0, 10, 0], 10, [9, 12, 2], [5, 40, 10], BAL)
    assert got == 2, f"loads [9, 12, 2]: worker 2, got {got}"


def test_the_longest_match_past_the_cache_threshold_wins():
    # worker 1 holds 8 of 10 elements: it wins, though it is busier (not past the thresholds)
    got = cache_aware([2, 8, 0], 10, [0, 3, 0], [50, 40, 10], BAL)
    assert got == 1, f"a match of 8/10 over 0.5 wins: worker 1, got {got}"
    got = cache_aware([6, 0, 7], 10, [0, 0, 0], [1, 1, 1], BAL)
    assert got == 2, f"the longest match, 7/10, wins: worker 2, got {got}"


def test_a_match_at_or_under_the_threshold_goes_to_the_smallest_tree():
    got = cache_aware([2, 5, 0], 10, [0, 0, 0], [50, 40, 10], BAL)
    assert got == 2, f"5/10 is not over 0.5: the smallest tree, worker 2, got {got}"
    got = cache_aware([4, 1, 0], 10, [0, 0, 0], [9, 40, 10], BAL)
    assert got == 0, f"4/10: the smallest tree (worker 0, also the best match), got {got}"
    got = cache_aware([0, 4, 0], 10, [0, 0, 0], [30, 40, 10], BAL)
    assert got == 2, f"4/10: the smallest tree, not the best match: worker 2, got {got}"
    got = cache_aware([0, 0], 0, [0, 0], [3, 1], BAL)
    assert got == 1, f"an empty key: the smallest tree, worker 1, got {got}"


def test_ties_go_to_the_worker_listed_first():
    cases = [
        (([6, 6], 10, [0, 0], [1, 1]), 0),
        (([0, 6, 6], 10, [0, 0, 0], [1, 2, 3]), 1),
        (([0, 0], 0, [0, 0], [3, 3]), 0),
        (([0, 0, 0], 10, [0, 0, 0], [5, 2, 2]), 1),
        (([0, 0, 0], 10, [9, 2, 2], [0, 1, 1]), 1),
    ]
    for args, want in cases:
        got = cache_aware(*args, BAL)
        assert got == want, f"cache_aware{args}: ties go to the first, worker {want}, got {got}"


def test_the_default_thresholds_are_sglangs():
    d = Balance()
    assert (d.abs_threshold, d.rel_threshold, d.cache_threshold) == (64, 1.5, 0.3)
    assert cache_aware([3, 0], 10, [0, 0], [9, 0], d) == 1, "3/10 is not over 0.3"
    assert cache_aware([4, 0], 10, [0, 0], [9, 0], d) == 0
    assert cache_aware([4, 0], 10, [100, 35], [9, 0], d) == 1, "65 apart, 100 > 1.5 x 35"
    assert cache_aware([4, 0], 10, [100, 67], [9, 0], d) == 0, "100 is not past 1.5 x 67"


def test_one_match_load_and_size_per_worker():
    for args, said in (
        (([1], 10, [0, 0], [1, 1]), "got 1, 2, 2"),
        (([1, 1], 10, [0], [1, 1]), "got 2, 1, 2"),
        (([1, 1], 10, [0, 0], [1]), "got 2, 2, 1"),
        (([], 10, [], []), "got 0, 0, 0"),
    ):
        with refuses(
            ValueError, f"cache_aware{args}", match=f"^one match, load and size per worker: {said}$"
        ):
            cache_aware(*args, BAL)


# --- all four in the router's pool --------------------------------------------------------------


def test_the_pool_keeps_each_tenant_on_one_worker_within_its_tree_size():
    pool = WorkerPool(["http://a", "http://b", "http://c"], "cache_aware", BAL, max_tree_size=400)
    systems = {t: f"You are the assistant of tenant {t}. " * 4 for t in "PQR"}
    seen: Dict[str, set] = {t: set() for t in systems}
    for i in range(12):
        tenant = "PQRRQP"[i % 6]
        worker = pool.pick(systems[tenant] + f"Question {i}?")
        seen[tenant].add(worker.url)
    assert all(len(urls) == 1 for urls in seen.values()), f"tenants spread: {seen}"
    assert len({next(iter(u)) for u in seen.values()}) == 3, f"new tenants spread out: {seen}"
    sizes = [w.tree.size for w in pool.workers]
    assert all(0 < s <= 400 for s in sizes), f"tree sizes {sizes}, bound 400"


def test_the_pool_sends_a_busy_tenants_request_to_the_idlest_worker():
    pool = WorkerPool(["http://a", "http://b"], "cache_aware", BAL, max_tree_size=1000)
    system = "You are the nurse of Juliet. " * 4
    first = pool.pick(system + "Where is she?")
    second = pool.pick("A different tenant entirely, with its own long preamble. " * 2)
    assert first is not second, "the new tenant goes to the empty tree"
    assert pool.pick(system + "What hour is it?") is first
    first.load = 10  # far busier than b (past 4 apart and 2 times)
    assert pool.pick(system + "Is she up?") is second
