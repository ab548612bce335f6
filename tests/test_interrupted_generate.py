"""An exception inside `LLM.generate` (Ctrl-C in a notebook, an error raised by an event subscriber
or a progress hook) propagates, and the engine is as it was before the call: no request slot or
KV page held, nothing queued, pending, running or in flight, no result left, not busy; the next
call gives a fresh engine's tokens (minisgl/llm/recover.py)."""

from __future__ import annotations

import pytest

from helpers import build_llm, greedy

PROMPTS = [[11, 12, 13, 14, 15, 16, 17, 18, 19], [11, 12, 13, 14, 15, 16, 40, 41], [7, 8, 9]]
NEW = 6
MODES = {
    "overlap": dict(overlap_scheduling=True),
    "normal": dict(overlap_scheduling=False),
    "overlap, page 4, chunked": dict(overlap_scheduling=True, page_size=4, max_extend_tokens=4),
}


class Boom(Exception):
    pass


def raise_at(llm, kind: str, nth: int, error: BaseException):
    """Subscribe a callback that raises `error` at the `nth` event of `kind`."""
    seen = [0]

    def callback(event) -> None:
        if event.kind == kind:
            seen[0] += 1
            if seen[0] == nth:
                raise error

    return llm.events.subscribe(callback)


def interrupt_model_at(llm, nth: int):
    """Ctrl-C arriving while the model computes its `nth` step (prefill 1, then decodes; eager or
    a CUDA graph's replay)."""
    engine, calls = llm.engine, [0]
    run_model = engine.run_model

    def interrupted(batch):
        calls[0] += 1
        if calls[0] == nth:
            raise KeyboardInterrupt
        return run_model(batch)

    engine.run_model = interrupted
    return lambda: delattr(engine, "run_model")


def interrupt_sampler_at(llm, nth: int):
    sampler, calls = llm.engine.sampler, [0]
    sample = sampler.sample

    def interrupted(*args, **kw):
        calls[0] += 1
        if calls[0] == nth:
            raise KeyboardInterrupt
        return sample(*args, **kw)

    sampler.sample = interrupted
    return lambda: delattr(sampler, "sample")


INJECTIONS = {
    "subscriber at the first prefill launch": lambda llm: raise_at(llm, "launch", 1, Boom()),
    "subscriber at the first pages_alloc": lambda llm: raise_at(llm, "pages_alloc", 1, Boom()),
    "subscriber at the second slot_alloc": lambda llm: raise_at(llm, "slot_alloc", 2, Boom()),
    "subscriber mid-decode (handle 3)": lambda llm: raise_at(llm, "handle", 3, Boom()),
    "subscriber at a decode launch (launch 4)": lambda llm: raise_at(llm, "launch", 4, Boom()),
    "progress-like hook at send 2": lambda llm: raise_at(llm, "send", 2, Boom()),
    "subscriber as a request ends (slot_free 1)": lambda llm: raise_at(llm, "slot_free", 1, Boom()),
    "Ctrl-C at a subscriber mid-decode": lambda llm: raise_at(
        llm, "handle", 4, KeyboardInterrupt()
    ),
    "Ctrl-C in the prefill forward": lambda llm: interrupt_model_at(llm, 1),
    "Ctrl-C in a decode forward": lambda llm: interrupt_model_at(llm, 3),
    "Ctrl-C in the sampler mid-decode": lambda llm: interrupt_sampler_at(llm, 4),
}


def assert_clean(llm, what: str) -> None:
    state = {
        "busy": llm.busy,
        "in flight": llm.in_flight,
        "results": dict(llm.results),
        "queued messages": llm._queue.pending,
        "pending": [p.uid for p in llm.prefill_manager.pending],
        "running": list(llm.decode_manager.running),
        "live": [r.uid for r in llm.live_requests()],
        "free slots": llm.table_manager.available_size,
        "locked tokens": llm.cache_manager.prefix_cache.protected_size,
    }
    want = dict(state, busy=False, results={}, pending=[], running=[], live=[])
    want.update({"in flight": False, "queued messages": 0, "locked tokens": 0})
    want["free slots"] = llm.table_manager.capacity
    assert state == want, f"{what}: the engine is not as before the call: {state}"
    llm.cache_manager.check_integrity()  # every page free or cached, once


@pytest.fixture(scope="module")
def fresh_tokens():
    return {
        mode: [o["token_ids"] for o in build_llm(**options).generate(PROMPTS, greedy(NEW))]
        for mode, options in MODES.items()
    }


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("where", list(INJECTIONS))
def test_an_interrupted_generate_leaves_the_engine_as_before(mode, where, fresh_tokens):
    llm = build_llm(**MODES[mode])
    llm.generate([PROMPTS[0][:5]], greedy(2))  # something in the prefix cache beforehand
    undo = INJECTIONS[where](llm)
    with pytest.raises((Boom, KeyboardInterrupt)):
        llm.generate(PROMPTS, greedy(NEW))
    undo()
    assert_clean(llm, f"{mode}, {where}")
    got = [o["token_ids"] for o in llm.generate(PROMPTS, greedy(NEW))]
    assert got == fresh_tokens[mode], (
        f"{mode}, {where}: the call after the interrupted one should give a fresh engine's tokens "
        f"{fresh_tokens[mode]}, got {got}"
    )
    assert_clean(llm, f"{mode}, {where}, then a whole call")


def test_requests_added_before_an_interrupted_generate_end_with_an_error():
    # They were cut short with the call's (a token of theirs may have gone with the interrupted
    # step): each ends with an error saying so, never with silently wrong tokens.
    llm = build_llm(overlap_scheduling=True)
    uid = llm.add_request(PROMPTS[2], greedy(NEW))
    undo = raise_at(llm, "handle", 2, Boom())
    with pytest.raises(Boom):
        llm.generate(PROMPTS[:2], greedy(NEW))
    undo()
    result = llm.results.pop(uid)
    assert result.finished and "interrupted: Boom" in (result.error or ""), (
        f"the request added before the call should end with an error naming the interruption, "
        f"got {result}"
    )
    assert_clean(llm, "after an interrupted call on a busy engine")
