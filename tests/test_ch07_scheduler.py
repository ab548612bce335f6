"""Chapter 7: the scheduler's normal loop, continuous batching, and the offline `LLM.generate`.

Every test runs the synchronous loop (overlap scheduling is chapter 11). The engine is watched
through its event log and its public state, never by patching it.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest
import torch
from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids

from minisgl.core import Batch, Req
from minisgl.kvcache import CacheHandle
from minisgl.scheduler import ChunkedReq, DecodeManager


pytestmark = pytest.mark.usefixtures("normal_loop")  # conftest.py: chapter 11 is not here yet


def launches(log) -> List[Tuple[str, List[int]]]:
    return [(e["phase"], list(e["uids"])) for e in log if e.kind == "launch"]


def assert_all_returned(llm) -> None:
    """After a run: every request slot is free again and every KV page is free or cached, once."""
    assert llm.table_manager.available_size == llm.table_manager.capacity, \
        f"{llm.table_manager.capacity - llm.table_manager.available_size} request slot(s) never came back"
    llm.cache_manager.check_integrity()


# ---------------------------------------------------------------- continuous batching


def test_requests_join_and_leave_the_running_batch():
    llm = build_llm()
    log = llm.events.record()
    p = prompt_ids()
    a = llm.add_request(p[0], greedy(6))
    b = llm.add_request(p[1], greedy(2))
    llm.step()  # prefill a, b
    llm.step()  # decode a, b: b has its 2 tokens and leaves
    c = llm.add_request(p[3], greedy(4))  # arrives while a is still running
    llm.run_until_idle()

    # A new prompt is prefilled before the running requests decode again; then it decodes with them.
    assert launches(log) == [
        ("prefill", [a, b]),
        ("decode", [a, b]),
        ("prefill", [c]),
        ("decode", [a, c]),
        ("decode", [a, c]),
        ("decode", [a, c]),
        ("decode", [a]),
    ], "the batches' composition over time is not what continuous batching gives"

    ref = hf_greedy([p[0], p[1], p[3]], 6)
    got = [llm.results[u].token_ids for u in (a, b, c)]
    assert_tokens_equal(got, [ref[0][:6], ref[1][:2], ref[2][:4]])
    assert all(llm.results[u].finished for u in (a, b, c))
    assert_all_returned(llm)


def test_normal_loop_handles_each_step_before_launching_the_next():
    llm = build_llm()
    log = llm.events.record()
    p = prompt_ids()
    llm.generate(p[:2], greedy(3))
    order = [(e.kind, e["step"]) for e in log if e.kind in ("launch", "handle")]
    steps = [s for kind, s in order if kind == "launch"]
    assert len(steps) == 3, f"expected one prefill and two decode steps, got {order}"
    assert order == [(kind, s) for s in steps for kind in ("launch", "handle")], \
        f"the normal loop must handle step N's results before it launches step N+1: {order}"


def test_one_step_processes_messages_and_runs_one_batch():
    llm = build_llm()
    log = llm.events.record()
    uid = llm.add_request(prompt_ids()[0], greedy(3))
    llm.step()
    assert launches(log) == [("prefill", [uid])]
    assert len(llm.results[uid].token_ids) == 1, "the prefill step's token should have arrived"
    llm.step()
    assert launches(log)[1:] == [("decode", [uid])]
    assert len(llm.results[uid].token_ids) == 2
    llm.step()
    assert llm.results[uid].finished and len(llm.results[uid].token_ids) == 3
    assert not llm.busy
    llm.step()  # nothing to do: no batch, no error
    assert len(launches(log)) == 3
    assert_all_returned(llm)


# ---------------------------------------------------------------- _prepare_batch


def _admit(llm, uid: int, ids: List[int], max_tokens: int) -> Req:
    """What the prefill manager does for a new request with nothing cached: a slot, its prompt in the
    token pool, and a Req that has computed nothing yet."""
    idx = llm.table_manager.allocate(uid)
    prompt = torch.tensor(ids, dtype=torch.int32)
    llm.token_pool[idx, : len(ids)] = prompt.to(llm.token_pool.device)
    return Req(prompt, idx, 0, max_tokens, uid, greedy(max_tokens), CacheHandle(0))


def _run(llm, forward_input) -> List[int]:
    llm.engine.stream.wait_stream(llm.stream)
    out = llm.engine.forward_batch(forward_input)
    out.copy_done.synchronize()
    return out.next_tokens_cpu.tolist()


@torch.inference_mode()
def test_prepare_batch_builds_prefill_and_decode_indices():
    llm = build_llm()
    p = prompt_ids()[:2]
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(p)]
    rows_of = [r.table_idx for r in reqs]
    lens = [len(ids) for ids in p]
    free_before = llm.cache_manager.num_free_pages

    # Prefill: every prompt token of every request, in batch order.
    batch = Batch(reqs, "prefill")
    fi = llm._prepare_batch(batch)
    want_rows = [row for row, n in zip(rows_of, lens) for _ in range(n)]
    want_cols = [j for n in lens for j in range(n)]
    assert fi.batch is batch
    assert fi.input_tuple[0].tolist() == want_rows, "input_tuple rows: each token's request slot"
    assert fi.input_tuple[1].tolist() == want_cols, "input_tuple columns: each token's position"
    assert batch.positions.tolist() == want_cols
    assert fi.write_tuple[0].tolist() == rows_of, "each sample goes to its request's row"
    assert fi.write_tuple[1].tolist() == lens, "each sample goes right after the prompt"
    out_loc = batch.out_loc.tolist()
    assert out_loc == llm.page_table[fi.input_tuple].tolist(), "out_loc: the page-table entry of every token"
    assert len(set(out_loc)) == sum(lens), "two tokens were given the same KV location"
    assert llm.cache_manager.num_free_pages == free_before - sum(lens), "prefill should take one page per token"
    assert batch.attn_metadata is not None, "the batch needs its attention metadata"

    ref = hf_greedy(p, 2)
    first = _run(llm, fi)
    assert first == [r[0] for r in ref]
    for row, n, tok in zip(rows_of, lens, first):  # where the decode step will read it
        assert int(llm.token_pool[row, n]) == tok

    # Decode: one token per request, the one just sampled, at the next position.
    batch = Batch(reqs, "decode")
    fi = llm._prepare_batch(batch)
    assert fi.input_tuple[0].tolist() == rows_of
    assert fi.input_tuple[1].tolist() == lens
    assert batch.positions.tolist() == lens
    assert fi.write_tuple[0].tolist() == rows_of
    assert fi.write_tuple[1].tolist() == [n + 1 for n in lens]
    new_loc = batch.out_loc.tolist()
    assert new_loc == [int(llm.page_table[row, n]) for row, n in zip(rows_of, lens)]
    assert not set(new_loc) & set(out_loc), "a decode token overwrote a prompt token's KV"
    assert llm.cache_manager.num_free_pages == free_before - sum(lens) - len(reqs)
    assert _run(llm, fi) == [r[1] for r in ref]


@torch.inference_mode()
def test_prepare_batch_sends_a_chunks_sample_to_the_scratch_row():
    llm = build_llm()
    ids = prompt_ids()[3]
    whole = _admit(llm, 0, ids, 4)
    # The first 3 prompt tokens as a chunk: its sample is junk and must not land in the prompt's row.
    chunk = ChunkedReq(whole.input_ids[:3], whole.table_idx, 0, 4, 0, whole.sampling_params, CacheHandle(0))
    fi = llm._prepare_batch(Batch([chunk], "prefill"))
    assert fi.input_tuple[1].tolist() == [0, 1, 2]
    assert fi.write_tuple[0].tolist() == [llm.engine.dummy_row], "a chunk's sample goes to the scratch row"
    _run(llm, fi)
    assert llm.token_pool[whole.table_idx, : len(ids)].tolist() == ids, "the chunk's sample overwrote the prompt"


# ---------------------------------------------------------------- DecodeManager.filter_reqs


def _req_after(uid: int, prompt_len: int, max_tokens: int, steps: int) -> Req:
    req = Req(torch.arange(prompt_len, dtype=torch.int32), uid, 0, max_tokens, uid, greedy(max_tokens))
    for _ in range(steps):
        req.complete_one()
    return req


def test_filter_reqs_keeps_decodable_requests_and_drops_finished_ones():
    dm = DecodeManager()
    going = _req_after(0, 5, 3, steps=1)  # prefilled, 2 tokens to go
    one_token = _req_after(1, 4, 1, steps=1)  # prefilled, and that was its only token
    short = _req_after(2, 6, 2, steps=1)
    dm.filter_reqs([going, one_token, short])
    assert list(dm.running) == [0, 2], "requests that can decode join, in batch order; a finished one does not"

    chunk = ChunkedReq(torch.arange(3, dtype=torch.int32), 3, 0, 4, 3, greedy(4))
    chunk.complete_one()
    dm.filter_reqs([chunk])
    assert list(dm.running) == [0, 2], "a chunked prefill is not decoding yet"

    going.complete_one()
    short.complete_one()  # short reaches its max_tokens on this step
    dm.filter_reqs([going, short])
    assert list(dm.running) == [0], "a request that reached max_tokens must leave the decode set"
    assert dm.running[0] is going
    batch = dm.schedule_next_batch()
    assert batch is not None and batch.reqs == [going] and batch.is_decode

    going.complete_one()
    dm.filter_reqs([going])
    assert not dm.running and dm.schedule_next_batch() is None


# ---------------------------------------------------------------- LLM.generate


def test_generate_returns_outputs_in_prompt_order():
    llm = build_llm()
    p = prompt_ids()
    counts = [7, 2, 5, 1]  # later prompts finish first
    out = llm.generate(p, [greedy(n) for n in counts])
    ref = hf_greedy(p, 7)
    assert [set(o) >= {"text", "token_ids"} for o in out] == [True] * 4
    assert_tokens_equal([o["token_ids"] for o in out], [r[:n] for r, n in zip(ref, counts)])
    assert not llm.results, "generate should hand back (and forget) its requests' results"
    assert_all_returned(llm)


def test_generate_with_text_prompts():
    llm = build_llm()
    if llm.tokenizer is None:
        pytest.skip("the model under test has no tokenizer")
    from helpers import PROMPT_TEXTS

    out = llm.generate(PROMPT_TEXTS, greedy(6))
    ref = hf_greedy(prompt_ids(), 6)
    assert_tokens_equal([o["token_ids"] for o in out], ref)
    for o in out:
        assert isinstance(o["text"], str) and o["text"] == llm.decode(o["token_ids"])
    single = llm.generate(PROMPT_TEXTS[1], greedy(6))  # one prompt, not in a list
    assert len(single) == 1 and single[0]["token_ids"] == ref[1]


def test_more_prompts_than_request_slots_queue_up():
    llm = build_llm(max_running_req=2)
    log = llm.events.record()
    p = prompt_ids()
    out = llm.generate(p, greedy(5))
    assert_tokens_equal([o["token_ids"] for o in out], hf_greedy(p, 5))
    batches = launches(log)
    assert max(len(uids) for _, uids in batches) == 2, "at most max_running_req requests may run at once"
    slots = {e["table_idx"] for e in log if e.kind == "slot_alloc"}
    assert slots == {0, 1}, f"the two slots should be reused by the waiting requests, got {slots}"
    assert_all_returned(llm)


@pytest.mark.parametrize("case", ["empty", "too_long", "id_too_large", "negative_id", "not_ints", "mismatched"])
def test_bad_input_is_refused_and_the_llm_keeps_serving(case):
    llm = build_llm()
    good = prompt_ids()[:2]
    bad = {
        "empty": ([], "empty"),
        "too_long": ([5] * (llm.engine.max_seq_len + 10), "context"),
        "id_too_large": (good[0][:3] + [llm.vocab_size], "vocabulary"),
        "negative_id": ([-1] + good[0][:3], "vocabulary"),
        "not_ints": ([1.5, 2.0], "integer"),
    }
    if case == "mismatched":
        with pytest.raises(ValueError, match="2 prompts but 1"):
            llm.generate(good, [greedy(3)])
    else:
        ids, words = bad[case]
        with pytest.raises(ValueError, match=f"prompt 1: .*{words}"):
            llm.generate([good[0], ids], greedy(3))
    assert not llm.results and not llm.busy, "a refused generate call must queue nothing"

    out = llm.generate(good, greedy(3))
    assert_tokens_equal([o["token_ids"] for o in out], hf_greedy(good, 3))
    assert_all_returned(llm)
