"""Chapter 23: scheduling under load. The judge's tests of its two exercises, in its words.

- `_choose_victim` (minisgl/scheduler/retract.py): the fewest generated tokens go first (counted
  from the client's prompt), then the longest prompt; a request reserved whole never.
- `_retract` (same file): what a retraction frees, keeps and requeues. Eight requests run on a pool
  that holds two of them whole, admitted on a tenth of their max_tokens, so decode steps retract
  again and again (classroom/retraction_runs.py); a watcher checks the engine right after every
  retraction, and the outputs must be an unpressured run's. Each bug class production engines have
  had with retraction (a double free through the prefix cache, a request lost or duplicated on
  requeue, stale KV cached) breaks a rule the watcher sees at the first retraction.
"""

from __future__ import annotations

import pytest

from classroom.retraction_runs import Victims, pressured_run
from helpers import test_device
from minisgl.scheduler.retract import Retraction

# ------------------------------------------------------------------ ch23.choose_victim


def _choose(book: Victims, reqs):
    return Retraction._choose_victim(book, reqs)


def _name(req):
    return None if req is None else req.uid


def test_the_victim_has_generated_the_fewest_tokens():
    book = Victims({})
    reqs = [book.request(0, 10, 7), book.request(1, 30, 3), book.request(2, 5, 12)]
    got = _name(_choose(book, reqs))
    assert got == 1, (
        f"retracted uid {got}: the victim is the request that has generated the fewest tokens "
        "(uid 1, 3 generated; uid 0 has 7, uid 2 has 12): it loses the least work"
    )
    got = _name(_choose(book, reqs[::-1]))
    assert got == 1, (
        f"retracted uid {got} with the batch in the other order: the rule is not the order"
    )


def test_a_resumed_requests_output_counts_from_the_clients_prompt():
    # uid 0 was retracted after 10 tokens and resumed from its 18 tokens received; it has 20 now
    book = Victims({})
    resumed, fresh = book.request(0, 8, 12, resumed_at=18), book.request(1, 6, 4)
    got = _name(_choose(book, [resumed, fresh]))
    assert got == 1, (
        f"retracted uid {got}: a resumed request has generated len(input_ids) - _prompt_len(req) "
        "tokens since the client's prompt (uid 0: 20 - 8 = 12), not the 2 since it resumed; "
        "uid 1 has generated 4"
    )


def test_of_requests_equal_in_output_the_longest_prompt_goes():
    book = Victims({})
    reqs = [
        book.request(0, 12, 4),
        book.request(1, 40, 4),
        book.request(2, 25, 4),
        book.request(3, 50, 9),
    ]
    got = _name(_choose(book, reqs))
    assert got == 1, (
        f"retracted uid {got}: of the requests with the fewest generated tokens (4: uids 0, 1, 2), "
        "the one with the longest prompt goes (uid 1, 40 tokens): it frees the most pages"
    )


def test_a_request_reserved_whole_is_never_the_victim():
    book = Victims({}, whole=[0])
    reqs = [book.request(0, 30, 1), book.request(1, 10, 6)]
    got = _name(_choose(book, reqs))
    assert got == 1, (
        f"retracted uid {got}: uid 0 is reserved whole (its pages are promised; it reached the "
        "bound on retractions), so uid 1 goes although it has generated more"
    )
    book.whole.add(1)
    got = _name(_choose(book, reqs))
    assert got is None, f"retracted uid {got} when every request is reserved whole: expected None"
    assert _choose(book, []) is None, "an empty batch has no victim: expected None"


# ------------------------------------------------------------------ ch23.retract

_RUNS = {}


def _run(overlap: bool, page_size: int = 1, max_retractions: int = 2):
    key = (overlap, page_size, max_retractions)
    if key not in _RUNS:
        _RUNS[key] = pressured_run(
            overlap=overlap,
            page_size=page_size,
            max_retractions=max_retractions,
            device=test_device(),
        )
    return _RUNS[key]


LOOPS = [(True, 1), (False, 1), (True, 4)]
IDS = ["overlap", "normal", "overlap-page4"]


@pytest.mark.parametrize("overlap,page_size", LOOPS, ids=IDS)
def test_every_retraction_leaves_the_engine_as_the_contract_says(overlap, page_size):
    run = _run(overlap, page_size)
    assert not run.problems, "after a retraction: " + "; ".join(run.problems)
    assert run.total >= 3, f"only {run.total} retraction(s): the pool put no pressure on the run"


@pytest.mark.parametrize("overlap,page_size", LOOPS, ids=IDS)
def test_retraction_keeps_greedy_and_seeded_outputs(overlap, page_size):
    run = _run(overlap, page_size)
    differ = [i for i, (a, b) in enumerate(zip(run.outputs, run.want)) if a != b]
    assert not differ, (
        f"requests {differ} differ from an unpressured run's output (uid {differ[0]}: "
        f"{len(run.outputs[differ[0]])} tokens, the first {run.outputs[differ[0]][:6]}, expected "
        f"{len(run.want[differ[0]])}, {run.want[differ[0]][:6]}) after {run.total} retractions"
    )
    assert not run.end_problems, "once every request has ended: " + "; ".join(run.end_problems)
    assert run.events == run.retracts, (
        f"'retract' events by uid {dict(run.events)}, retractions {dict(run.retracts)}: "
        "one event each"
    )


@pytest.mark.parametrize("bound", [1, 2])
def test_no_request_is_retracted_more_often_than_the_bound(bound):
    run = _run(True, 1, bound)
    worst = max(run.retracts.values(), default=0)
    assert worst <= bound, (
        f"retractions per uid {dict(run.retracts)}: more than max_retractions={bound}"
    )
    assert run.outputs == run.want, "the outputs differ from an unpressured run's"
    assert worst == bound, (
        f"retractions per uid {dict(run.retracts)}: none reached the bound, weak test"
    )
