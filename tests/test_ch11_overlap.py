"""Chapter 11: overlap scheduling, and the four upstream bugs it invites.

Each `check_*` function takes the LLM class to test, so `test_ch11_variants.py` can run the same
checks against the known-wrong upstream variants and prove that each one is caught.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest

from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids
from minisgl import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM


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


def assert_idle_and_clean(llm) -> None:
    llm.cache_manager.check_integrity()
    free = llm.table_manager.available_size
    assert free == llm.config.max_running_req, \
        f"{llm.config.max_running_req - free} request slot(s) not returned after all requests ended"


# ---------------------------------------------------------------- the checks


def check_overlap_equals_normal_and_hf(llm_class, cache, chunk, page_size, streams="eager") -> None:
    prompts = prompt_ids()
    want = hf_greedy(prompts, 10)
    for overlap in (True, False):
        set_overlap(overlap)
        llm = build_llm(llm_class=llm_class, cache_type=cache, max_extend_tokens=chunk,
                        page_size=page_size, cpu_streams=streams)
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(10))]
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
        assert flags == [False] * (n - 1) + [True], \
            f"request with max_tokens={n}: finished flags {flags}, expected {[False] * (n - 1) + [True]}"
    assert_idle_and_clean(llm)


def check_no_message_after_eos(llm_class, overlap: bool) -> None:
    """Rule 2: a request that samples EOS gets nothing more, though it rode along one more step."""
    set_overlap(overlap)
    prompt = prompt_ids()[0]
    ref = hf_greedy([prompt], 8)[0]
    k, eos = eos_at(ref, 2)
    llm = build_llm(llm_class=llm_class)
    llm.eos_token_id = eos
    sent = record_messages(llm)
    uid = llm.add_request(prompt, SamplingParams(max_tokens=8))
    llm.run_until_idle()
    want = [(t, False) for t in ref[:k]] + [(eos, True)]
    assert sent[uid] == want, f"messages {sent[uid]}, expected {want} (EOS {eos} is output token {k})"
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
                    violations.append(f"slot {ev['table_idx']} given to request {ev['uid']} "
                                      f"while step {step}, which still writes it, is in flight")

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
    llm.eos_token_id = eos
    violations = watch_slot_reuse(llm)
    first = llm.add_request(prompts[3], SamplingParams(max_tokens=6))
    second = llm.add_request(prompts[0], greedy(4))
    llm.run_until_idle()
    assert not violations, violations[0]
    assert llm.results[first].token_ids == ref[: k + 1]
    assert llm.results[second].token_ids == hf_greedy([prompts[0]], 4)[0]
    assert_idle_and_clean(llm)


def check_slot_race_gives_right_tokens_deferred(llm_class) -> None:
    """Rule 3, as wrong tokens: with deferred CPU streams the step in flight really writes its
    stale sample into the row after the scheduler has put the next request's prompt there."""
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
    llm = build_llm(llm_class=llm_class, max_running_req=1, cpu_streams="deferred", cache_type="naive")
    llm.eos_token_id = eos
    a = llm.add_request(short, SamplingParams(max_tokens=6))
    b = llm.add_request(long_, greedy(6))
    llm.run_until_idle()
    assert llm.results[a].token_ids == ref_short[: k + 1], \
        f"the request that ends at EOS: {llm.results[a].token_ids}, expected {ref_short[: k + 1]}"
    assert_tokens_equal([llm.results[b].token_ids], hf_greedy([long_], 6),
                        "the request that took over the freed slot")
    assert_idle_and_clean(llm)


def check_abort_while_prefill_in_flight(llm_class) -> None:
    """Rule 4: an abort that arrives while the prefill is running: nothing is sent, nothing leaks,
    and the prefix cache stays consistent."""
    set_overlap(True)
    llm = build_llm(llm_class=llm_class, cache_type="radix")
    sent = record_messages(llm)
    prompt = prompt_ids()[0]
    uid = llm.add_request(prompt, greedy(8))

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


@pytest.mark.parametrize("cache,chunk,page_size", [("radix", 8192, 1), ("naive", 5, 1), ("radix", 7, 4)])
def test_overlap_equals_normal_and_hf(cache, chunk, page_size):
    check_overlap_equals_normal_and_hf(LLM, cache, chunk, page_size)


def test_overlap_with_deferred_streams_equals_hf():
    check_overlap_equals_normal_and_hf(LLM, "radix", 7, 4, streams="deferred")


@pytest.mark.parametrize("overlap", [False, True])
def test_order_of_events(overlap):
    set_overlap(overlap)
    llm = build_llm()
    events = llm.events.record()
    llm.generate([prompt_ids()[0]], greedy(3))
    order = [f"{e.kind} {e['step']}" for e in events if e.kind in ("launch", "handle")]
    expected = (["launch 1", "launch 2", "handle 1", "launch 3", "handle 2", "handle 3"] if overlap
                else ["launch 1", "handle 1", "launch 2", "handle 2", "launch 3", "handle 3"])
    assert order == expected


@pytest.mark.parametrize("overlap", [False, True])
def test_finished_flag_on_last_token_only(overlap):
    check_finished_flag_on_last_token(LLM, overlap)


@pytest.mark.parametrize("overlap", [False, True])
def test_no_message_after_eos(overlap):
    check_no_message_after_eos(LLM, overlap)


def test_slot_not_reused_while_batch_in_flight():
    check_slot_not_reused_in_flight(LLM)


def test_slot_reuse_race_deferred_streams():
    check_slot_race_gives_right_tokens_deferred(LLM)


def test_the_overlap_loop_never_waits_for_the_step_it_just_launched():
    """With deferred CPU streams a launched step runs only when someone waits for it, so a step
    still pending after `step()` returns proves the loop handed it on without waiting (the GPU
    test checks the same on real streams)."""
    set_overlap(True)
    llm = build_llm(cpu_streams="deferred")
    for ids in prompt_ids():
        llm.add_request(ids, greedy(5))
    phases = set()
    while llm.busy:
        llm.step()
        if llm._last_data is not None:
            launched, out = llm._last_data
            assert not out.copy_done.query(), f"the loop waited for its own {launched.batch.phase} step"
            phases.add(launched.batch.phase)
    assert phases == {"prefill", "decode"}
    assert_idle_and_clean(llm)


def test_abort_while_prefill_in_flight():
    check_abort_while_prefill_in_flight(LLM)


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
        if chunked not in counts_at_abort and pending is not None and pending.chunked_req is not None:
            abort_at(chunked)
    with pytest.raises(ValueError, match="unknown request uid"):
        llm.abort(12345)
    llm.abort(keep)  # after it finished: a no-op
    llm._queue.put(AbortBackendMsg(uid=777))  # unknown at the scheduler level: ignored
    llm.step()
    assert queued not in sent
    for uid, n in counts_at_abort.items():
        assert len(sent.get(uid, [])) == n, f"request {uid} was sent tokens after its abort"
    assert_tokens_equal([llm.results[keep].token_ids], hf_greedy([prompts[1]], 6), "the request nobody aborted")
    states = {e["uid"]: e["state"] for e in log if e.kind == "abort"}
    assert states == {queued: "queued", decoding: "running", chunked: "prefilling", 777: "not running"}
    assert_idle_and_clean(llm)
