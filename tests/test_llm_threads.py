"""`LLM.generate` from several threads at once (a web app's thread pool): the calls queue up and
each gets its own right answer; a generate nested in a running one is refused, saying why."""

from __future__ import annotations

import threading

import pytest

from helpers import build_llm, greedy


def prompts_of(i: int):
    return [[3 + i, 40 + i, 7, 9 + 2 * i], [100 + i] * (3 + i % 4)]


def serial_answers(n: int):
    llm = build_llm()
    return [
        [o["token_ids"] for o in llm.generate(prompts_of(i), greedy(6 + i % 3))] for i in range(n)
    ]


@pytest.mark.parametrize("threads", [2, 12])
def test_generate_from_many_threads_at_once_answers_each_right(threads):
    want = serial_answers(threads)
    llm = build_llm()
    got, errors = [None] * threads, []
    start = threading.Barrier(threads)

    def call(i: int) -> None:
        start.wait()  # all at once
        try:
            outs = llm.generate(prompts_of(i), greedy(6 + i % 3))
            got[i] = [o["token_ids"] for o in outs]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    workers = [threading.Thread(target=call, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors, f"concurrent generate calls failed: {errors}"
    for i in range(threads):
        assert got[i] == want[i], (
            f"thread {i} of {threads}: expected its own prompts' tokens {want[i]}, got {got[i]}"
        )
    assert not llm.busy and not llm.results, "every call's requests and results are gone"
    llm.cache_manager.check_integrity()
    assert llm.table_manager.available_size == llm.table_manager.capacity


def test_generate_nested_in_a_running_generate_is_refused_and_leaves_nothing():
    llm = build_llm()
    want = serial_answers(1)[0]

    def nested(event) -> None:
        if event.kind == "handle":
            llm.generate([[5, 6]], greedy(2))

    unsubscribe = llm.events.subscribe(nested)
    with pytest.raises(RuntimeError, match="inside a running generate"):
        llm.generate(prompts_of(0), greedy(6))
    unsubscribe()
    assert not llm.busy and not llm.results
    llm.cache_manager.check_integrity()
    got = [o["token_ids"] for o in llm.generate(prompts_of(0), greedy(6))]
    assert got == want, "after the refused nested call the engine answers as a fresh one"
