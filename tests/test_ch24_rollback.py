"""Chapter 24: the rollback of a verify step's rejected positions (`SpeculativeSteps._roll_back`,
minisgl/scheduler/speculative.py), in the chapter's words.

Three greedy requests run with speculation (k = 4) on the bundled model, on a pool of 40 pages
(a page freed too early is soon handed out again), at page sizes 1 and 4,
with a scripted drafter the target always agrees with (ends fall inside accepted runs), one it
never agrees with, and one with every third token wrong (runs accepted part-way:
classroom/rollback_runs.py). A watcher checks the pool right after every rollback and after every
step; the outputs must be the engine's without speculation and the cache's integrity check must
hold once all end.
"""

from __future__ import annotations

from typing import List

from classroom.rollback_runs import DRAFTERS, EVERY_STEP, RULES, rollback_run
from helpers import test_device

CASES = [(p, d) for p in (1, 4) for d in DRAFTERS]


def _broken(rule: str) -> List[str]:
    out = []
    for page_size, drafter in CASES:
        run = rollback_run(page_size=page_size, drafter=drafter, device=test_device())
        assert run.rollbacks > 0, "no verify step ran: the drafter proposed nothing"
        seen = run.broken(rule)
        if seen:
            out.append(f"page size {page_size}, a drafter that {drafter}: {seen}")
    return out


def test_no_page_of_a_rejected_position_stays_allocated():
    seen = _broken(RULES[0])
    assert not seen, (
        "the pages past each request's accepted KV, from pages_for(cached_len) up to "
        "pages_for(base + d), go back to the free list after the verify step: left allocated they "
        "leak, since the next step maps fresh pages over those positions. " + "; ".join(seen)
    )


def test_a_running_request_keeps_every_page_of_its_accepted_tokens():
    seen = _broken(RULES[1])
    assert not seen, (
        "the page holding the last accepted token stays with a running request (pages_for rounds "
        "up; freed, another request would overwrite accepted KV). " + "; ".join(seen)
    )


def test_no_page_is_freed_twice():
    seen = _broken(RULES[2])
    assert not seen, (
        "a page goes to the free list once: a request that ended gave back its accepted pages "
        "with its cache_req, and only the pages of its rejected positions are still its own; "
        "the page-table row holds locations, one per position (page n starts at n * page_size). "
        + "; ".join(seen)
    )


def test_no_page_is_freed_while_the_prefix_cache_holds_it():
    seen = _broken(RULES[3])
    assert not seen, (
        "a page the prefix cache holds (an ended request's accepted tokens, a shared prefix) is "
        "the cache's: the rollback frees only past the accepted KV. " + "; ".join(seen)
    )


def test_every_page_is_free_cached_or_held_after_every_step_and_all_back_at_the_end():
    problems = []
    for page_size, drafter in CASES:
        run = rollback_run(page_size=page_size, drafter=drafter, device=test_device())
        seen = run.broken(EVERY_STEP)
        if seen or run.end_problem:
            problems.append(
                f"page size {page_size}, a drafter that {drafter}: {seen or run.end_problem}"
            )
    assert not problems, (
        "after every step each page is free, in the prefix cache or held by a running request, "
        "once; with nothing running, the integrity check holds. " + "; ".join(problems)
    )


def test_outputs_equal_the_engine_without_speculation():
    differ = []
    for page_size, drafter in CASES:
        run = rollback_run(page_size=page_size, drafter=drafter, device=test_device())
        for i, (got, want) in enumerate(zip(run.outputs, run.want)):
            if got != want:
                at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
                differ.append(
                    f"page size {page_size}, a drafter that {drafter}: request {i} differs from "
                    f"token {at} on ({got[at : at + 3]} against {want[at : at + 3]})"
                )
    assert not differ, (
        "greedy tokens with speculation are the engine's without it, whatever the drafter: a "
        "page freed too early is overwritten by another request's KV. " + "; ".join(differ)
    )
