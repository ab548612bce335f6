"""Chapter 11: overlap scheduling, and the four upstream bugs it invites.

Each `check_*` function takes the LLM class to test, so `test_ch11_variants.py` can run the same
checks against the known-wrong upstream variants and prove that each one is caught.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest

from helpers import (
    assert_tokens_equal,
    build_llm,
    cpu_streams_llm,
    greedy,
    hf_greedy,
    prefill_batches,
    prompt_ids,
)
from minisgl import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from refusals import refuses


def set_overlap(on: bool) -> None:
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not on


def record_messages(llm) -> Dict[int, List[Tuple[int, bool]]]:
    """Every (token, finished) the scheduler sends, per request uid, from the event log."""
    sent: Dict[int, List[Tuple[int, bool]]] = {}

    def on_event(ev):
        if ev.kind == "send":
            for m in ev["msgs"]:
                sent.setdefault(m.uid, []).append((m.next_token, m.finished))

    llm.events.subscribe(on_event)
    return sent


def eos_at(reference: List[int], min_index: int = 1) -> Tuple[int, int]:
    """A token of `reference` that appears there first at index k >= min_index: (k, token)."""
    for k in range(min_index, len(reference)):
        if reference[k] not in reference[:k]:
            return k, reference[k]
    raise AssertionError("no usable EOS position in the reference output")


def assert_request_tokens(who: str, got, want) -> None:
    """One request's tokens against the reference, in the words of what was seen: a request that
    finished early (fewer tokens, the rest right), one that went on past its end, or one that
    continues another text (as when a step in flight writes a stale sample into its prompt)."""
    got, want = list(got), list(want)
    if got == want:
        return
    if len(got) < len(want) and want[: len(got)] == got:
        raise AssertionError(
            f"{who} finished early: {len(got)} of its {len(want)} tokens arrived ({got}, expected "
            f"{want}); a request is finished by the tokens the CPU has received, whatever "
            "device_len already counts"
        )
    if len(got) > len(want) and got[: len(want)] == want:
        raise AssertionError(
            f"{who} went on past its end: {len(got)} tokens ({got}), expected {len(want)} ({want})"
        )
    pos = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
    raise AssertionError(
        f"{who} continues another text from its token {pos}: {got}, expected {want} (what a stale "
        "sample written into its prompt's row by a step still in flight does)"
    )


def assert_idle_and_clean(llm) -> None:
    try:
        llm.cache_manager.check_integrity()
    except AssertionError as e:
        # The books are chapter 8's; what unbalances them here is one of this chapter's rules.
        raise AssertionError(
            f"with every request ended, the KV pages do not balance ({e}). This chapter's rules "
            "that keep them: chunks produce nothing (a ChunkedReq is never cached, its next "
            "piece goes on under the same handle), a request ends exactly once (its results "
            "after the end, or after an abort, are dropped), and its KV goes back once, through "
            "_free_req_resources"
        ) from None
    free = llm.table_manager.available_size
    parked = len(getattr(llm, "_deferred_slots", []))
    assert free == llm.config.max_running_req, (
        f"{llm.config.max_running_req - free} request slot(s) not returned after all requests ended"
        + (
            f" ({parked} still parked in _deferred_slots with nothing in flight: once the last "
            "batch in flight is handled, nothing can write them, and no later turn may come)"
            if parked
            else ""
        )
    )
    # a request whose end was handled is no longer live: an abort arriving for it later must find
    # nothing to free (live_requests: the requests that hold a slot and KV right now)
    live = llm.live_requests()
    assert not live, f"{len(live)} request(s) still counted as live after all requests ended"


# ---------------------------------------------------------------- the checks


def assert_flags_on_last_token(sent: Dict[int, List[Tuple[int, bool]]], max_tokens: int) -> None:
    """Rule 1 on a run of requests that ignore EOS: max_tokens messages each, only the last one
    finished."""
    want = [False] * (max_tokens - 1) + [True]
    for uid, msgs in sorted(sent.items()):
        flags = [f for _, f in msgs]
        first = flags.index(True) + 1 if True in flags else None
        assert flags == want, (
            f"request {uid}, max_tokens={max_tokens}, EOS ignored: {len(flags)} message(s), the "
            f"first finished flag on message {first} (finished flags {flags}); only message "
            f"{max_tokens}, the last, may say finished. Decide it from the tokens the CPU has "
            "received: under overlap, can_decode already describes the step in flight"
        )


def check_overlap_equals_normal_and_hf(llm_class, cache, chunk, page_size, streams=None) -> None:
    """`streams`: None, the test's device; "eager" or "deferred", that CPU stand-in on the CPU."""
    prompts = prompt_ids()
    want = hf_greedy(prompts, 10)
    build = build_llm if streams is None else lambda **kw: cpu_streams_llm(streams, **kw)
    for overlap in (True, False):
        set_overlap(overlap)
        llm = build(
            llm_class=llm_class, cache_type=cache, max_extend_tokens=chunk, page_size=page_size
        )
        sent = record_messages(llm)
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(10))]
        # the finished flags first: a flag one token early cuts every output short by one, and
        # "got 9 tokens" says less than where the flag came
        assert_flags_on_last_token(sent, 10)
        assert_tokens_equal(got, want, f"{'overlap' if overlap else 'normal'} loop vs Hugging Face")
        # and again: the second round hits the prefix cache
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(10))]
        assert_tokens_equal(got, want, "second round (prefix cache warm)")
        assert_idle_and_clean(llm)


def check_finished_flag_on_last_token(llm_class, overlap: bool) -> None:
    """Rule 1: exactly max_tokens messages, and only the last one says finished."""
    set_overlap(overlap)
    llm = build_llm(llm_class=llm_class)
    sent = record_messages(llm)
    lengths = [1, 2, 3, 5]
    prompts = prompt_ids()
    uids = [llm.add_request(p, greedy(n)) for p, n in zip(prompts, lengths)]
    llm.run_until_idle()
    for uid, n in zip(uids, lengths):
        flags = [f for _, f in sent.get(uid, [])]
        assert flags == [False] * (n - 1) + [True], (
            f"request with max_tokens={n}: finished flags {flags}, expected "
            f"{[False] * (n - 1) + [True]}"
        )
    assert_idle_and_clean(llm)


def check_no_message_after_eos(llm_class, overlap: bool) -> None:
    """Rule 2: a request that samples EOS gets nothing more, though it rode along one more step."""
    set_overlap(overlap)
    prompt = prompt_ids()[0]
    ref = hf_greedy([prompt], 8)[0]
    k, eos = eos_at(ref, 2)
    llm = build_llm(llm_class=llm_class)
    llm.eos_token_ids = {eos}
    sent = record_messages(llm)
    uid = llm.add_request(prompt, SamplingParams(max_tokens=8))
    llm.run_until_idle()
    want = [(t, False) for t in ref[:k]] + [(eos, True)]
    assert sent[uid] == want, (
        f"messages {sent[uid]}, expected {want} (EOS {eos} is output token {k})"
    )
    assert_idle_and_clean(llm)


def watch_slot_reuse(llm) -> List[str]:
    """Record every slot handed out while a batch that holds it is still in flight."""
    in_flight: Dict[int, set] = {}
    violations: List[str] = []

    def on_event(ev):
        if ev.kind == "launch":
            in_flight[ev["step"]] = set(ev["table_idxs"])
        elif ev.kind == "handle":
            in_flight.pop(ev["step"], None)
        elif ev.kind == "slot_alloc":
            for step, rows in in_flight.items():
                if ev["table_idx"] in rows:
                    violations.append(
                        f"slot {ev['table_idx']} given to request {ev['uid']} "
                        f"while step {step}, which still holds it, is in flight"
                    )

    llm.events.subscribe(on_event)
    return violations


def check_slot_not_reused_in_flight(llm_class) -> None:
    """Rule 3, as an invariant: a request that ends by EOS frees its slot only after the step that
    still holds it is done; a waiting request then gets it."""
    set_overlap(True)
    prompts = prompt_ids()
    ref = hf_greedy([prompts[3]], 6)[0]
    k, eos = eos_at(ref, 1)
    llm = build_llm(llm_class=llm_class, max_running_req=1)
    llm.eos_token_ids = {eos}
    violations = watch_slot_reuse(llm)
    first = llm.add_request(prompts[3], SamplingParams(max_tokens=6))
    second = llm.add_request(prompts[0], greedy(4))
    llm.run_until_idle()
    assert not violations, violations[0]
    assert_request_tokens(
        "the request that ends at EOS (its slot then goes to the next one)",
        llm.results[first].token_ids,
        ref[: k + 1],
    )
    assert_request_tokens(
        "the request that waits for the freed slot",
        llm.results[second].token_ids,
        hf_greedy([prompts[0]], 4)[0],
    )
    assert_idle_and_clean(llm)


def check_slot_race_gives_right_tokens_deferred(llm_class, device: str | None = None) -> None:
    """Rule 3, as wrong tokens: with deferred CPU streams the step in flight really writes its
    stale sample into the row after the scheduler has put the next request's prompt there.
    `device`: "cpu" pins the CPU's deferred streams; None, the test's device (on a GPU the caller
    keeps the engine stream behind,
    test_ch11_gpu.py::test_slot_reuse_race_on_the_gpu_upstream_vs_fix)."""
    set_overlap(True)
    prompts = prompt_ids()
    short = prompts[3]
    ref_short = hf_greedy([short], 6)[0]
    k, eos = eos_at(ref_short, 1)
    # The short request samples EOS as output k; the step in flight then writes a stale sample at
    # position len(short)+k+1 of the row. Make that the last token of the next request's prompt, the
    # one its first output depends on most. (That stale step runs after the next request's prompt
    # has been written: it reads its input from the row and predicts the next token. A prompt in
    # reverse word order keeps the prediction from matching the prompt by chance.)
    stale_pos = len(short) + k + 1
    long_ = list(reversed(prompts[0] * 4))[: stale_pos + 1]
    # naive cache: the long prompt is read from the token pool in full, never from the prefix cache
    options = dict(llm_class=llm_class, max_running_req=1, cache_type="naive")
    llm = (
        cpu_streams_llm(**options)
        if device == "cpu"
        else build_llm(cpu_streams="deferred", **options)
    )
    llm.eos_token_ids = {eos}
    a = llm.add_request(short, SamplingParams(max_tokens=6))
    b = llm.add_request(long_, greedy(6))
    llm.run_until_idle()
    assert_request_tokens(
        "the request that ends at EOS", llm.results[a].token_ids, ref_short[: k + 1]
    )
    assert_request_tokens(
        "the request that waits for the freed slot",
        llm.results[b].token_ids,
        hf_greedy([long_], 6)[0],
    )
    assert_idle_and_clean(llm)


def check_abort_while_prefill_in_flight(llm_class, max_tokens: int = 8) -> None:
    """Rule 4: an abort that arrives while the prefill is running: nothing is sent, nothing leaks,
    and the prefix cache stays consistent. With max_tokens=1 the prefill is also the request's
    last step: it is no longer decoding, yet still in flight."""
    set_overlap(True)
    llm = build_llm(llm_class=llm_class, cache_type="radix")
    sent = record_messages(llm)
    prompt = prompt_ids()[0]
    uid = llm.add_request(prompt, greedy(max_tokens))

    def abort_on_first_launch(ev):
        if ev.kind == "launch" and ev["step"] == 1:
            llm.abort(uid)  # processed at the next loop iteration, with step 1 still in flight

    llm.events.subscribe(abort_on_first_launch)
    llm.run_until_idle()
    assert uid not in sent, f"the aborted request was sent {sent.get(uid)}"
    assert_idle_and_clean(llm)
    # the engine still serves requests correctly afterwards (the cached prefix is sound)
    got = llm.generate([prompt], greedy(5))[0]["token_ids"]
    assert_tokens_equal([got], hf_greedy([prompt], 5), "a request after the abort")


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize(
    "cache,chunk,page_size", [("radix", 8192, 1), ("naive", 5, 1), ("radix", 7, 4)]
)
def test_overlap_equals_normal_and_hf(cache, chunk, page_size):
    check_overlap_equals_normal_and_hf(LLM, cache, chunk, page_size)


def test_overlap_with_deferred_streams_equals_hf():
    # on the CPU under --device cuda too (GPU:
    # test_ch11_gpu.py::test_float32_matches_hf_with_and_without_cuda_graphs)
    check_overlap_equals_normal_and_hf(LLM, "radix", 7, 4, streams="deferred")


@pytest.mark.parametrize("overlap", [False, True])
def test_order_of_events(overlap):
    set_overlap(overlap)
    llm = build_llm()
    events = llm.events.record()
    llm.generate([prompt_ids()[0]], greedy(3))
    # `handle N` comes once step N's results are processed: in the normal loop the finished
    # request's slot is freed while they are (under overlap it may be deferred: not checked)
    kinds = ("launch", "handle") if overlap else ("launch", "handle", "slot_free")
    order = [
        f"{e.kind} {e['step']}" if e.kind != "slot_free" else "slot_free"
        for e in events
        if e.kind in kinds
    ]
    expected = (
        ["launch 1", "launch 2", "handle 1", "launch 3", "handle 2", "handle 3"]
        if overlap
        else ["launch 1", "handle 1", "launch 2", "handle 2", "launch 3", "slot_free", "handle 3"]
    )
    assert order == expected, f"events in the order {order}, expected {expected}"
    # a handle event describes the step it handles, as its launch did (the timeline views read them)
    launched = {e["step"]: (e["phase"], e["uids"]) for e in events if e.kind == "launch"}
    for e in events:
        if e.kind == "handle":
            got = (e.fields.get("phase"), e.fields.get("uids"))
            assert got == launched[e["step"]], (
                f"the handle event of step {e['step']} says (phase, uids) = {got}, its launch "
                f"said {launched[e['step']]}"
            )


@pytest.mark.parametrize("overlap", [False, True])
def test_finished_flag_on_last_token_only(overlap):
    check_finished_flag_on_last_token(LLM, overlap)


@pytest.mark.parametrize("overlap", [False, True])
def test_no_message_after_eos(overlap):
    check_no_message_after_eos(LLM, overlap)


def test_slot_not_reused_while_batch_in_flight():
    check_slot_not_reused_in_flight(LLM)


def test_slot_reuse_race_deferred_streams():
    # on the CPU under --device cuda too (GPU:
    # test_ch11_gpu.py::test_slot_reuse_race_on_the_gpu_upstream_vs_fix)
    check_slot_race_gives_right_tokens_deferred(LLM, device="cpu")


def test_the_overlap_loop_never_waits_for_the_step_it_just_launched():
    """With deferred CPU streams a launched step runs only when someone waits for it, so a step
    still pending after `step()` returns proves the loop handed it on without waiting. On the CPU
    under --device cuda too; on real streams:
    test_ch11_gpu.py::test_scheduler_never_waits_for_the_step_it_just_launched."""
    set_overlap(True)
    llm = cpu_streams_llm()
    for ids in prompt_ids():
        llm.add_request(ids, greedy(5))
    phases = set()
    while llm.busy:
        llm.step()
        if llm._last_data is not None:
            launched, out = llm._last_data
            assert not out.copy_done.query(), (
                f"the loop waited for its own {launched.batch.phase} step"
            )
            phases.add(launched.batch.phase)
    assert phases == {"prefill", "decode"}
    assert_idle_and_clean(llm)


@pytest.mark.parametrize("max_tokens", [8, 1])
def test_abort_while_prefill_in_flight(max_tokens):
    check_abort_while_prefill_in_flight(LLM, max_tokens)


def check_abort_meets_the_last_step_in_flight(llm_class) -> None:
    """Rule 4 at the end of a decode: a client that leaves as its answer completes. The abort is
    taken in at the start of the turn that handles the request's last step: the request has left
    the decode manager (it cannot decode further) but is still launched, in `_live`. The abort must
    find it there ("running"), and the last step's token must not reach the client that left."""
    set_overlap(True)
    llm = build_llm(llm_class=llm_class, cache_type="radix")
    log = llm.events.record()
    prompt = prompt_ids()[0]
    n = 4
    uid = llm.add_request(prompt, greedy(n))

    def abort_at_last_launch(ev):
        # the prefill gives token 1, decode steps 2..n: launch n is the request's last step
        if ev.kind == "launch" and ev["step"] == n and uid in ev["uids"]:
            llm.abort(uid)  # taken in at the next turn, with step n in flight

    llm.events.subscribe(abort_at_last_launch)
    llm.run_until_idle()
    aborts = [(i, e["state"]) for i, e in enumerate(log) if e.kind == "abort" and e["uid"] == uid]
    assert len(aborts) == 1, f"{len(aborts)} abort event(s) for one abort"
    at, state = aborts[0]
    assert state == "running", (
        f"the abort found the request {state!r}: its last step was in flight, so it was still "
        "launched (in _live), though no longer in the decode manager"
    )
    late = [
        (m.next_token, m.finished)
        for e in log[at:]
        if e.kind == "send"
        for m in e["msgs"]
        if m.uid == uid
    ]
    assert not late, f"the aborted request was sent {late} after its abort"
    assert_idle_and_clean(llm)


def test_an_abort_that_meets_the_requests_last_step_in_flight_still_aborts_it():
    check_abort_meets_the_last_step_in_flight(LLM)


def check_an_abort_in_the_turn_after_an_eos_keeps_the_eos(llm_class) -> None:
    """Rules 2 and 4 in one turn: request A samples EOS in step N, whose handling comes after step
    N+1 (with A in it) was launched; request B is aborted at the start of the next turn, before
    step N+1 is handled. `finished_reqs` must then hold both: A's extra token dropped (rule 2),
    B's too (rule 4). An abort that sets the set to {B} instead of adding B forgets A."""
    set_overlap(True)
    a, b = prompt_ids()[:2]
    ref_a, ref_b = hf_greedy([a, b], 8)
    k, eos = next(
        (k, t) for k, t in enumerate(ref_a) if k >= 2 and t not in ref_a[:k] and t not in ref_b
    )
    llm = build_llm(llm_class=llm_class)
    llm.eos_token_ids = {eos}
    sent = record_messages(llm)
    uid_a = llm.add_request(a, SamplingParams(max_tokens=8))
    uid_b = llm.add_request(b, SamplingParams(max_tokens=8))

    def abort_b_once_a_ends(ev):
        if ev.kind == "send" and any(m.uid == uid_a and m.finished for m in ev["msgs"]):
            llm.abort(uid_b)  # taken in at the start of the next turn

    llm.events.subscribe(abort_b_once_a_ends)
    llm.run_until_idle()
    want = [(t, False) for t in ref_a[:k]] + [(eos, True)]
    assert sent[uid_a] == want, (
        f"request {uid_a} ended with EOS {eos} (its output token {k}) and request {uid_b} was "
        f"aborted in the next turn, while {uid_a}'s extra step was in flight: {uid_a} was sent "
        f"{sent[uid_a][len(want) :] or sent[uid_a]} after its EOS (expected {want}); the abort "
        "must add to finished_reqs, keeping the request that finished this turn"
    )
    assert_idle_and_clean(llm)


def test_an_abort_in_the_turn_after_another_requests_eos_keeps_that_eos():
    check_an_abort_in_the_turn_after_an_eos_keeps_the_eos(LLM)


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_in_every_state(overlap):
    """Aborts while queued, mid chunked prefill, during decode, after finishing, and of an unknown
    uid: the aborted requests get nothing afterwards, the others are unaffected."""
    from minisgl.message import AbortBackendMsg

    set_overlap(overlap)
    prompts = prompt_ids()
    llm = build_llm(max_running_req=3, max_extend_tokens=8)
    sent = record_messages(llm)
    log = llm.events.record()
    decoding = llm.add_request(prompts[3], greedy(12))
    keep = llm.add_request(prompts[1], greedy(6))
    chunked = llm.add_request(prompts[0] * 3, greedy(6))  # prefilled 8 tokens at a time
    queued = llm.add_request(prompts[2], greedy(6))  # waits: all three slots are taken
    llm.step()
    llm.abort(queued)
    counts_at_abort: Dict[int, int] = {}

    def abort_at(uid: int) -> None:
        counts_at_abort[uid] = len(sent.get(uid, []))
        llm.abort(uid)

    while llm.busy:
        llm.step()
        if decoding not in counts_at_abort and len(sent.get(decoding, [])) >= 2:
            abort_at(decoding)
        pending = llm.prefill_manager.get(chunked)
        if (
            chunked not in counts_at_abort
            and pending is not None
            and pending.chunked_req is not None
        ):
            abort_at(chunked)
    with refuses(ValueError, "abort(12345), a uid never given", match="unknown request uid"):
        llm.abort(12345)
    llm.abort(keep)  # after it finished: a no-op
    llm._queue.put(AbortBackendMsg(uid=777))  # unknown at the scheduler level: ignored
    # a client that disconnects just as its request ends: the abort reaches the scheduler anyway,
    # and the request it names holds nothing any more
    llm._queue.put(AbortBackendMsg(uid=keep))
    llm.step()
    assert queued not in sent
    for uid, n in counts_at_abort.items():
        assert len(sent.get(uid, [])) == n, f"request {uid} was sent tokens after its abort"
    assert_tokens_equal(
        [llm.results[keep].token_ids], hf_greedy([prompts[1]], 6), "the request nobody aborted"
    )
    aborts = [e["uid"] for e in log if e.kind == "abort"]
    twice = sorted({uid for uid in aborts if aborts.count(uid) > 1})
    assert not twice, f"request(s) {twice} got more than one abort event for one abort"
    states = {e["uid"]: e["state"] for e in log if e.kind == "abort"}
    want = {
        queued: "queued",
        decoding: "running",
        chunked: "prefilling",
        777: "not running",
        keep: "not running",
    }
    wrong = {uid: states.get(uid) for uid in want if states.get(uid) != want[uid]}
    assert not wrong, (
        f"abort events found these states: {wrong}, expected { ({u: want[u] for u in wrong}) }"
    )
    assert_idle_and_clean(llm)


def test_the_overlap_loop_blocks_only_when_it_has_nothing_to_do():
    """Chapter 7: with no work at all a server blocks on receive until a message comes. The overlap
    loop may block only then: with a step in flight it must poll, or that step's results (and the
    next launch) would wait for the next client; with requests waiting to run it must run them."""
    set_overlap(True)
    prompts = prompt_ids()
    k, eos = eos_at(hf_greedy([prompts[3]], 6)[0], 1)
    # one slot: the second request waits until the first one's slot is back, a turn with nothing
    # in flight and a request waiting
    llm = build_llm(max_running_req=1)
    llm.eos_token_ids = {eos}
    calls: List[Tuple[bool, bool, bool]] = []  # (blocking, a step in flight, requests waiting)
    receive = llm.receive_msg

    def spy(blocking=False):
        calls.append((bool(blocking), llm._last_data is not None, llm.has_work))
        return receive(blocking)

    llm.receive_msg = spy
    llm.add_request(prompts[3], SamplingParams(max_tokens=6))
    llm.add_request(prompts[0], greedy(4))
    llm.run_until_idle()
    llm.step()  # nothing in flight, nothing to do
    assert any(waiting and not in_flight for _, in_flight, waiting in calls), (
        "the run never reached a turn with a request waiting and nothing in flight, which it "
        "must (request 0 ends, then request 1 waits for the only slot): request 0's end was not "
        "handled as it should be, or its slot never came back; the finished-flag and slot tests "
        "of _process_last_data, _free_req_resources and the loop's slot release say which"
    )
    for blocking, in_flight, waiting in calls:
        assert not (blocking and in_flight), (
            "the loop received with blocking=True while a step was in flight"
        )
        assert not (blocking and waiting), (
            "the loop received with blocking=True while requests were waiting to run"
        )
    assert calls[-1][0], (
        "with nothing in flight and nothing to do the loop polled instead of blocking (a "
        "server would spin)"
    )


class StagedCopies(LLM):
    """As on a GPU, a step's index tensors reach the engine by a copy on the scheduler's stream
    (from pinned memory, non-blocking): until that stream has run, the engine would read garbage."""

    def _prepare_batch(self, batch):
        forward_input = super()._prepare_batch(batch)
        tensors = [*forward_input.input_tuple, *forward_input.write_tuple]
        values = [t.clone() for t in tensors]
        for t in tensors:
            t.zero_()

        def copy() -> None:
            for t, v in zip(tensors, values):
                t.copy_(v)

        self.stream.launch(copy)
        return forward_input

    def _forward(self, forward_input):
        assert self.stream.pending == 0, (
            f"step {self._step + 1} was launched before the engine stream waited "
            "for the scheduler stream, where its index tensors are copied"
        )
        return super()._forward(forward_input)


def test_each_step_waits_for_the_scheduler_stream_before_it_launches():
    """`self.engine.stream.wait_stream(self.stream)` before every launch: the engine reads the
    step's index tensors only once the scheduler's stream has copied them. Deferred CPU streams, on
    the CPU
    under --device cuda too (no GPU counterpart: a real race is rare on a GPU)."""
    set_overlap(True)
    prompts = prompt_ids()
    llm = cpu_streams_llm(llm_class=StagedCopies, max_extend_tokens=7)
    got = [o["token_ids"] for o in llm.generate(prompts, greedy(4))]
    # the reference other tests use: cached already
    want = [ref[:4] for ref in hf_greedy(prompts, 10)]
    assert_tokens_equal(got, want, "with the index tensors copied on the scheduler stream")
    assert_idle_and_clean(llm)


def test_an_aborted_chunked_prefill_keeps_its_slot_while_its_chunk_is_in_flight():
    """Rule 3 for aborts: a chunk in flight still reads its prompt from the request's token-pool
    row, so the row of a request aborted part-way through its chunked prefill goes back only once
    that
    chunk is done, like any other freed slot."""
    set_overlap(True)
    prompts = prompt_ids()
    llm = build_llm(max_running_req=1, max_extend_tokens=8)
    violations = watch_slot_reuse(llm)
    sent = record_messages(llm)
    chunked = llm.add_request(prompts[0] * 3, greedy(4))  # prefilled 8 tokens at a time
    waiting = llm.add_request(prompts[1], greedy(4))  # waits for the only slot

    def abort_on_first_launch(ev):
        if ev.kind == "launch" and ev["step"] == 1:
            llm.abort(chunked)  # processed at the next turn, with the first chunk in flight

    llm.events.subscribe(abort_on_first_launch)
    llm.run_until_idle()
    assert not violations, violations[0]
    assert chunked not in sent, f"the aborted request was sent {sent.get(chunked)}"
    assert_request_tokens(
        "the request that waits for the aborted request's slot",
        llm.results[waiting].token_ids,
        hf_greedy([prompts[1]], 6)[0][:4],
    )
    assert_idle_and_clean(llm)


def test_a_freed_slot_returns_once_the_step_that_held_it_is_handled():
    """Rule 3's other half: a deferred slot goes back at the next handling of results (that step is
    then done), not only when the engine runs dry. Here a request waits for the slot of one that
    ends by EOS while a third request keeps decoding."""
    set_overlap(True)
    prompts = prompt_ids()
    k, eos = eos_at(hf_greedy([prompts[3]], 6)[0], 1)
    llm = build_llm(max_running_req=2)
    llm.eos_token_ids = {eos}
    log = llm.events.record()
    ending = llm.add_request(prompts[3], SamplingParams(max_tokens=6))
    llm.add_request(prompts[1], greedy(16))  # keeps a step in flight every turn
    waiting = llm.add_request(prompts[0], greedy(3))
    llm.run_until_idle()
    events = [e for e in log if e.kind in ("launch", "handle")]
    last = max(e["step"] for e in events if e.kind == "launch" and ending in e["uids"])
    after = next(i for i, e in enumerate(events) if e.kind == "handle" and e["step"] == last)
    want = next(e["step"] for e in events[after:] if e.kind == "launch")
    got = next(e["step"] for e in events if e.kind == "launch" and waiting in e["uids"])
    assert got == want, (
        f"the waiting request started at step {got}; the slot it waited for was free "
        f"once step {last} was handled, so step {want} should have started it"
    )
    assert_idle_and_clean(llm)


def test_a_prompt_is_cached_as_soon_as_its_prefill_is_handled():
    """Chapter 8: `cache_req(finished=False)` right after a prefill, so a request that arrives while
    the first one is still decoding reuses its prompt's KV instead of computing it again."""
    set_overlap(True)
    prompt = prompt_ids()[0]
    llm = build_llm(cache_type="radix")
    log = llm.events.record()
    llm.add_request(prompt, greedy(8))
    llm.step()
    llm.step()  # the prefill is handled (the first decode step is in flight)
    second = llm.add_request(prompt, greedy(3))
    llm.run_until_idle()
    computed = next(b[second] for b in prefill_batches(log) if second in b)
    assert computed <= 1, (
        f"a request with the same prompt computed {computed} of its {len(prompt)} prompt "
        "tokens while the first one was decoding: its prompt was not in the prefix cache"
    )
    assert_tokens_equal(
        [llm.results[second].token_ids],
        [hf_greedy([prompt], 5)[0][:3]],
        "the request that hit the cache",
    )
    assert_idle_and_clean(llm)


def test_eos_ends_only_requests_that_heed_it_and_only_if_the_model_has_one():
    """`ignore_eos` requests run past EOS to max_tokens; a model without an EOS id (None) ends
    every request at max_tokens."""
    set_overlap(True)
    prompts = prompt_ids()
    ref = hf_greedy(prompts, 10)
    k, eos = eos_at(ref[0], 1)
    llm = build_llm()
    llm.eos_token_ids = {eos}  # a stand-in EOS: output token k of the first prompt
    got = llm.generate([prompts[0]], greedy(8))[0]["token_ids"]
    assert_tokens_equal(
        [got], [ref[0][:8]], f"a request with ignore_eos=True (EOS {eos} is its output token {k})"
    )
    llm.eos_token_ids = set()
    got = [o["token_ids"] for o in llm.generate(prompts, SamplingParams(max_tokens=5))]
    assert_tokens_equal(got, [r[:5] for r in ref], "a model whose EOS id is None")
    assert_idle_and_clean(llm)
