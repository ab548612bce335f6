"""Chapter 23: the cache-aware order of the waiting queue (`order_queue`,
minisgl/scheduler/policy.py). The judge's tests of the exercise, in its words.

The rules are checked on stand-in requests whose cached prefix is known (classroom/order_runs.py):
the most cached tokens first, counted in tokens; equal matches in arrival order; arrival order
past `max_queue` waiting requests; a second prompt of the same uncached run behind the rest; the
front (a started chunk, the retracted) first whatever the policy. Then the engine: on two tenants
whose system prompts evict each other, lpm computes fewer prefill tokens than FCFS, with the same
outputs.
"""

from __future__ import annotations

import pytest

from classroom.order_runs import Queue, tenant_tokens, uids
from helpers import build_llm
from minisgl.env import ENV
from minisgl.scheduler.policy import SHARED_RUN, order_queue
from refusals import refuses


def _order(queue, pending, policy="lpm", max_queue=128):
    return uids(order_queue(pending, queue, policy, max_queue))


def test_the_most_cached_prompt_goes_first():
    q = Queue()
    pending = [q.request(0, 20, 3), q.request(1, 20, 12), q.request(2, 20, 0), q.request(3, 20, 7)]
    got = _order(q, pending)
    assert got == [1, 3, 0, 2], (
        f"lpm order {got} for cached tokens 3, 12, 0, 7 (uids 0 to 3): the most cached first "
        "(they compute the fewest prefill tokens), [1, 3, 0, 2]"
    )


def test_the_match_is_counted_in_tokens_not_as_a_share_of_the_prompt():
    q = Queue()
    pending = [q.request(0, 10, 8), q.request(1, 30, 15)]
    got = _order(q, pending)
    assert got == [1, 0], (
        f"lpm order {got}: uid 1 has 15 of 30 tokens cached, uid 0 has 8 of 10; the match is "
        "counted in tokens (15 saved against 8), not as a share of the prompt"
    )


def test_equal_matches_keep_arrival_order():
    q = Queue()
    pending = [q.request(0, 20, 5), q.request(1, 20, 5), q.request(2, 20, 9), q.request(3, 20, 5)]
    got = _order(q, pending)
    assert got == [2, 0, 1, 3], (
        f"lpm order {got}: uids 0, 1, 3 match 5 tokens each, uid 2 matches 9; equal matches keep "
        "the order they arrived in (no one waits longer than the ones who came after it)"
    )
    pending = [pending[3], pending[1], pending[0]]
    got = _order(q, pending)
    assert got == [3, 1, 0], f"lpm order {got} of uids 3, 1, 0 arrived in that order, equal matches"


def test_past_max_queue_the_order_is_arrival_order():
    q = Queue()
    pending = [q.request(0, 20, 0), q.request(1, 20, 9), q.request(2, 20, 4)]
    got = _order(q, pending, max_queue=2)
    assert got == [0, 1, 2], (
        f"order {got} with 3 waiting and max_queue 2: past max_queue nothing is matched, "
        "arrival order"
    )
    got = _order(q, pending, max_queue=3)
    assert got == [1, 2, 0], (
        f"order {got} with 3 waiting and max_queue 3: up to max_queue waiting, lpm still orders"
    )


def test_the_queue_limit_counts_every_waiting_request():
    q = Queue()
    started = q.request(9, 20, 0, started=True)
    pending = [started, q.request(0, 20, 0), q.request(1, 20, 9)]
    got = _order(q, pending, max_queue=2)
    assert got == [9, 0, 1], (
        f"order {got} with 3 waiting (a started chunk among them) and max_queue 2: the limit "
        "counts the whole queue, so this is arrival order"
    )


def test_fcfs_keeps_arrival_order():
    q = Queue()
    pending = [q.request(0, 20, 0), q.request(1, 20, 9), q.request(2, 20, 4)]
    got = _order(q, pending, policy="fcfs")
    assert got == [0, 1, 2], f"fcfs order {got}: arrival order, whatever is cached"


def test_an_unknown_policy_is_a_value_error_that_names_it():
    q = Queue()
    with refuses(ValueError, "order_queue(..., policy='sjf', ...)", match="sjf"):
        order_queue([q.request(0, 20, 0)], q, "sjf", 128)


def test_a_second_prompt_of_the_same_uncached_run_goes_behind_the_rest():
    q = Queue()
    first = q.request(0, SHARED_RUN + 10, 4)
    twin = q.request(1, SHARED_RUN + 10, 4, same_as=first)
    other = q.request(2, 20, 0)
    got = _order(q, [first, twin, other])
    assert got == [0, 2, 1], (
        f"lpm order {got}: uids 0 and 1 would compute the same {SHARED_RUN} uncached tokens "
        "next; the first keeps its place, the second goes behind the rest (a step later the "
        "first one's tokens are cached and it matches them)"
    )


def test_twins_behind_the_rest_keep_arrival_order_and_need_the_same_match():
    q = Queue()
    first = q.request(0, SHARED_RUN + 10, 4)
    twins = [q.request(u, SHARED_RUN + 10, 4, same_as=first) for u in (1, 2)]
    other = q.request(3, 20, 0)
    got = _order(q, [first, twins[0], other, twins[1]])
    assert got == [0, 3, 1, 2], (
        f"lpm order {got}: the twins 1 and 2 behind the rest, in arrival order"
    )
    shifted = q.request(4, SHARED_RUN + 10, 0, same_as=first)  # same tokens, another match
    got = _order(q, [first, shifted, other])
    assert got == [0, 4, 3], (
        f"lpm order {got}: uid 4 has uid 0's tokens but matches 0 of them, uid 0 matches 4: they "
        "would compute different tokens next, so neither waits for the other"
    )


def test_a_short_uncached_rest_is_never_a_twin():
    q = Queue()
    first = q.request(0, SHARED_RUN, 4)  # fewer than SHARED_RUN uncached tokens left
    twin = q.request(1, SHARED_RUN, 4, same_as=first)
    other = q.request(2, 20, 0)
    got = _order(q, [first, twin, other])
    assert got == [0, 1, 2], (
        f"lpm order {got}: fewer than SHARED_RUN uncached tokens are too short to wait for: "
        "equal matches in arrival order"
    )


def test_a_started_chunk_then_the_retracted_go_first_whatever_the_policy():
    q = Queue()
    fresh = q.request(0, 20, 9)
    retracted = q.request(1, 20, 0, retractions=1)
    started = q.request(2, 20, 0, started=True)
    pending = [fresh, retracted, started, q.request(3, 20, 12)]
    for policy in ("lpm", "fcfs"):
        got = _order(q, pending, policy=policy)
        want = [2, 1, 3, 0] if policy == "lpm" else [2, 1, 0, 3]
        assert got == want, (
            f"{policy} order {got}: the started chunk (uid 2) first, then the retracted (uid 1), "
            f"then the rest ({want})"
        )


def test_the_queue_is_left_as_it_was():
    q = Queue()
    pending = [q.request(0, 20, 0), q.request(1, 20, 9)]
    before = list(pending)
    got = order_queue(pending, q, "lpm", 128)
    assert pending == before and got is not pending, "order_queue returns a new list"


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_lpm_computes_fewer_prefill_tokens_than_fcfs(overlap):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    fcfs_out, fcfs_tokens = tenant_tokens(build_llm, "fcfs")
    lpm_out, lpm_tokens = tenant_tokens(build_llm, "lpm")
    assert lpm_out == fcfs_out, "lpm changed the outputs"
    # FCFS alternates tenants, and each evicts the other's prompt: every request computes its
    # whole prompt. lpm runs a tenant's requests while its prompt is cached.
    assert lpm_tokens * 2 < fcfs_tokens, f"prefill tokens: lpm {lpm_tokens}, fcfs {fcfs_tokens}"


def test_lpm_falls_back_to_fcfs_past_its_queue_limit():
    _, fcfs_tokens = tenant_tokens(build_llm, "fcfs")
    _, lpm_tokens = tenant_tokens(build_llm, "lpm")
    _, never = tenant_tokens(build_llm, "lpm", lpm_max_queue=0)  # every queue is past the limit
    _, late = tenant_tokens(build_llm, "lpm", lpm_max_queue=3)  # FCFS until only 3 wait
    assert never == fcfs_tokens, f"prefill tokens: lpm_max_queue 0 {never}, fcfs {fcfs_tokens}"
    assert lpm_tokens < late < fcfs_tokens, (lpm_tokens, late, fcfs_tokens)
