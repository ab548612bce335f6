"""Chapter 7: the scheduler's normal loop, continuous batching, and the offline `LLM.generate`.

Every test runs the synchronous loop (overlap scheduling is chapter 11). The engine is watched
through its event log and its public state, never by patching it.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest
import torch

from classroom.device_tags import (
    distinct_scheduler_device,
    host_tensors,
    off_device_tensors,
    sampling_devices,
    tag_device_copies,
    tagging_made_for,
    wrong_devices,
)
from classroom.host_copies import host_copies, tag_page_table
from classroom.step_dtypes import wrong_dtypes
from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids
from minisgl import LLM, SamplingParams
from minisgl.core import Batch, Req
from minisgl.engine import BatchSamplingArgs
from minisgl.env import ENV
from minisgl.kvcache import CacheHandle
from minisgl.scheduler import ChunkedReq, DecodeManager
from minisgl.utils.streams import DeferredStream
from refusals import refuses

pytestmark = pytest.mark.usefixtures("normal_loop")  # conftest.py: chapter 11 is not here yet


def launches(log) -> List[Tuple[str, List[int]]]:
    return [(e["phase"], list(e["uids"])) for e in log if e.kind == "launch"]


def launches_with_lens(log) -> List[List[int]]:
    """The number of tokens each request processed, per launched batch."""
    return [list(e["extend_lens"]) for e in log if e.kind == "launch"]


def assert_all_returned(llm) -> None:
    """After a run: every request slot is free again and every KV page is free or cached, once."""
    assert llm.table_manager.available_size == llm.table_manager.capacity, (
        f"{llm.table_manager.capacity - llm.table_manager.available_size} request slot(s) "
        "never came back"
    )
    llm.cache_manager.check_integrity()


# ---------------------------------------------------------------- _prepare_batch


def _admit(llm, uid: int, ids: List[int], max_tokens: int) -> Req:
    """What the prefill manager does for a new request with nothing cached: a slot, its prompt in
    the
    token pool, and a Req that has computed nothing yet."""
    idx = llm.table_manager.allocate(uid)
    prompt = torch.tensor(ids, dtype=torch.int32)
    llm.token_pool[idx, : len(ids)] = prompt.to(llm.token_pool.device)
    return Req(prompt, idx, 0, max_tokens, uid, greedy(max_tokens), CacheHandle(0))


def assert_int64_indices(fi) -> None:
    """The chapter's contract: input_tuple and out_loc are int64 (a GPU kernel computes byte
    offsets from out_loc; in int32 they overflow in a large KV pool)."""
    named = {
        "input_tuple rows": fi.input_tuple[0],
        "input_tuple positions": fi.input_tuple[1],
        "batch.out_loc": fi.batch.out_loc,
    }
    wrong = [f"{name} is {t.dtype}" for name, t in named.items() if t.dtype != torch.int64]
    assert not wrong, (
        f"index tensors should be int64, but {' and '.join(wrong)} (a GPU kernel computes byte "
        "offsets from them, which overflow int32 in a large KV pool)"
    )


def assert_same(got, want: List[int], rule: str) -> None:
    """`got` (a tensor or list) equals `want`; else the rule, where they first differ, and both."""
    got = got.tolist() if isinstance(got, torch.Tensor) else got
    if got == want:
        return
    at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    raise AssertionError(
        f"{rule}: {len(got)} entries, expected {len(want)}; first difference at entry {at}: "
        f"expected {want[at : at + 4]}..., got {got[at : at + 4]}... (expected {want[:12]}, got "
        f"{got[:12]}, first 12 shown)"
    )


def _run(llm, forward_input) -> List[int]:
    llm.engine.stream.wait_stream(llm.stream)
    out = llm.engine.forward_batch(forward_input)
    out.copy_done.synchronize()
    return out.next_tokens_cpu.tolist()


@torch.inference_mode()
def test_prepare_batch_builds_prefill_and_decode_indices():
    llm = build_llm()
    p = prompt_ids()[:2]
    llm.table_manager.allocate()  # slot 0 is taken: a request's slot is not its place in the batch
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(p)]
    rows_of = [r.table_idx for r in reqs]
    lens = [len(ids) for ids in p]
    free_before = llm.cache_manager.num_free_pages

    # Prefill: every prompt token of every request, in batch order.
    batch = Batch(reqs, "prefill")
    fi = llm._prepare_batch(batch)
    want_rows = [row for row, n in zip(rows_of, lens) for _ in range(n)]
    want_cols = [j for n in lens for j in range(n)]
    assert fi.batch is batch, "the ForwardInput should carry the batch it was given"
    assert_int64_indices(fi)
    assert_same(fi.input_tuple[0], want_rows, "input_tuple rows: each token's request slot")
    assert_same(fi.input_tuple[1], want_cols, "input_tuple columns: each token's position")
    assert_same(batch.positions, want_cols, "batch.positions: each processed token's position")
    assert_same(
        fi.write_tuple[0], rows_of, "write_tuple rows: each sample goes to its request's row"
    )
    assert_same(
        fi.write_tuple[1], lens, "write_tuple columns: each sample goes right after the prompt"
    )
    out_loc = batch.out_loc.tolist()
    assert_same(
        batch.out_loc,
        llm.page_table[fi.input_tuple].tolist(),
        "out_loc: the page-table entry of every token (at input_tuple's row and position), read "
        "after allocate_paged wrote it (Locations first)",
    )
    assert len(set(out_loc)) == sum(lens), (
        f"two tokens were given the same KV location: {len(set(out_loc))} distinct in out_loc "
        f"for {sum(lens)} tokens"
    )
    took = free_before - llm.cache_manager.num_free_pages
    assert took == sum(lens), (
        f"prefill should take one page per token (page size 1): {sum(lens)}, it took {took}"
    )
    assert batch.attn_metadata is not None, "the batch needs its attention metadata"
    meta_rows = batch.attn_metadata.page_table
    for i, (row, n) in enumerate(zip(rows_of, lens)):
        got, want = meta_rows[i, :n].tolist(), llm.page_table[row, :n].tolist()
        assert got == want, (
            f"Locations first: the attention metadata's key locations of request {i} are "
            f"{got[:8]}..., the page table holds {want[:8]}... once allocate_paged has run: "
            "prepare_metadata copies the rows as they are when it is called"
        )

    ref = hf_greedy(p, 2)
    first = _run(llm, fi)
    assert first == [r[0] for r in ref], (
        f"prefill sampled {first}, Hugging Face gives {[r[0] for r in ref]}"
    )
    for row, n, tok in zip(rows_of, lens, first):  # where the decode step will read it
        assert int(llm.token_pool[row, n]) == tok, (
            f"the sample is not in the token pool at (row {row}, column {n})"
        )

    # Decode: one token per request, the one just sampled, at the next position.
    batch = Batch(reqs, "decode")
    fi = llm._prepare_batch(batch)
    assert_int64_indices(fi)
    assert fi.input_tuple[0].tolist() == rows_of, (
        "decode input_tuple rows: one per request, its slot"
    )
    assert fi.input_tuple[1].tolist() == lens, (
        f"decode input_tuple columns: {fi.input_tuple[1].tolist()}, expected {lens} (where the "
        "prefill wrote them)"
    )
    assert batch.positions.tolist() == lens, (
        f"decode positions: {batch.positions.tolist()}, expected {lens}"
    )
    assert fi.write_tuple[0].tolist() == rows_of, "decode write_tuple rows: each request's slot"
    assert fi.write_tuple[1].tolist() == [n + 1 for n in lens], (
        f"decode write_tuple columns: {fi.write_tuple[1].tolist()}, expected "
        f"{[n + 1 for n in lens]} (device_len)"
    )
    new_loc = batch.out_loc.tolist()
    assert new_loc == [int(llm.page_table[row, n]) for row, n in zip(rows_of, lens)], (
        "decode out_loc: the page-table entry of each request's new position"
    )
    assert not set(new_loc) & set(out_loc), "a decode token overwrote a prompt token's KV"
    assert llm.cache_manager.num_free_pages == free_before - sum(lens) - len(reqs), (
        "a decode step should take one page per request"
    )
    second = _run(llm, fi)
    assert second == [r[1] for r in ref], (
        f"decode sampled {second}, Hugging Face gives {[r[1] for r in ref]}"
    )


def _prefill_then_decode(reqs):
    """A prefill step of `reqs`, then a decode step: (phase, batch) each; after each the requests
    advance as launching the step would (complete_one), so the next one is a decode."""
    for phase in ("prefill", "decode"):
        yield phase, Batch(reqs, phase)
        for r in reqs:
            r.complete_one()


@torch.inference_mode()
def test_prepare_batch_moves_the_tensors_it_builds_to_the_device():
    # On a CPU, kit.to_device returns its argument, so a step built without it runs; on a GPU its
    # index tensors would stay in host memory. The tagging kit (classroom/device_tags.py) marks
    # what went through to_device, and torch keeps the mark through indexing and conversions.
    llm = build_llm()
    tag_device_copies(llm.engine)
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(prompt_ids()[:2])]
    for phase, batch in _prefill_then_decode(reqs):
        fi = llm._prepare_batch(batch)
        left = host_tensors(fi, llm.engine.device)
        assert not left, (
            f"{phase} step: {', '.join(left)} did not go through self.engine.kit.to_device(...): "
            "never copied, a GPU's kernels get host memory; copied with .to(device) or made with "
            "device=, the scheduler waits for each copy (to_device's is asynchronous)"
        )


@torch.inference_mode()
def test_prepare_batch_reads_the_page_table_where_it_lives():
    """The page table is on the device; out_loc is an index of it by tensors already there. A
    copy of it (or of a device tensor) to the host makes the CPU wait for the device every step,
    which a CPU never shows: classroom/host_copies.py records each such copy."""
    llm = build_llm()
    tag_device_copies(llm.engine)
    distinct_scheduler_device(llm)
    tag_page_table(llm)
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(prompt_ids()[:2])]
    for phase, batch in _prefill_then_decode(reqs):
        with tagging_made_for(llm.device), host_copies(llm) as copies:
            llm._prepare_batch(batch)
        assert not copies, (
            f"{phase} step: _prepare_batch copied device state to the host: "
            f"{'; '.join(copies)} (read the page table where it lives: index it with the "
            "step's device tensors; a copy to the host waits for the device, every step)"
        )


@torch.inference_mode()
def test_prepare_batch_hands_the_forward_only_tensors_on_the_engines_device():
    """Every tensor the step carries into the forward pass (the batch's, every field of the
    attention metadata, the sampling arguments, both index tuples) is on the engine's device,
    whichever way it got there. On a CPU the scheduler's device is `cpu:0` and what is made for it,
    or copied by the kit, is tagged (classroom/device_tags.py); the walk names every tensor that is
    not, so a part built for a bare "cpu" (the metadata, the sampling arguments) is caught too."""
    llm = build_llm()
    tag_device_copies(llm.engine)
    distinct_scheduler_device(llm)
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(prompt_ids()[:2])]
    reqs[1].sampling_params = SamplingParams(temperature=0.7, max_tokens=4)  # sampling tensors
    for phase, batch in _prefill_then_decode(reqs):
        with tagging_made_for(llm.device):
            fi = llm._prepare_batch(batch)
        off = off_device_tensors(fi, llm.device)
        assert not off, (
            f"{phase} step: every tensor handed to the forward must be on self.device "
            f"({llm.device}; prepare_metadata and from_params are given it, not a bare 'cpu'), "
            f"not: {', '.join(off)}"
        )


@torch.inference_mode()
def test_prepare_batch_hands_the_forward_tensors_of_the_dtypes_their_contracts_state():
    """Every tensor the step carries into the forward pass has the dtype its contract states
    (classroom/step_dtypes.py): a CPU runs an int32 `batch.positions` or index tuple, a GPU's
    kernels do not. The walk covers every field, not one named tensor more."""
    llm = build_llm()
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(prompt_ids()[:2])]
    reqs[1].sampling_params = SamplingParams(temperature=0.7, max_tokens=4)  # sampling tensors
    for phase, batch in _prefill_then_decode(reqs):
        fi = llm._prepare_batch(batch)
        wrong = wrong_dtypes(fi)
        assert not wrong, f"{phase} step: " + "; ".join(wrong)


@torch.inference_mode()
def test_prepare_batch_leaves_the_requests_lengths_to_the_launch():
    """The lengths advance when the step is launched (`_forward`, `complete_one`), not while it is
    prepared: the launch event's extend_lens, the prompt logprobs' slice and the prefix cache all
    read cached_len and device_len after `_prepare_batch` has returned."""
    llm = build_llm()
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(prompt_ids()[:2])]
    for phase, batch in _prefill_then_decode(reqs):
        before = [(r.cached_len, r.device_len) for r in reqs]
        llm._prepare_batch(batch)
        after = [(r.cached_len, r.device_len) for r in reqs]
        assert after == before, (
            f"{phase} step: (cached_len, device_len) per request went from {before} to {after} "
            "inside _prepare_batch; they are the launch's to advance"
        )


def test_prepare_batch_leaves_the_input_ids_to_the_engine():
    """`batch.input_ids` is the engine's to gather, on its stream, from the token pool through
    input_tuple: under overlap (chapter 11) the previous step's sample is written into the pool on
    the engine stream while the scheduler prepares this one, so a gather on the scheduler side
    reads a token the engine has not written yet. On a CPU nothing races and the engine overwrites
    the field, so the step's output cannot show it: the field itself does."""
    llm = build_llm()
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(prompt_ids()[:2])]
    for phase, batch in _prefill_then_decode(reqs):
        llm._prepare_batch(batch)
        got = batch.input_ids
        shown = f"shape {list(got.shape)}" if isinstance(got, torch.Tensor) else type(got).__name__
        assert got is None, (
            f"{phase} step: _prepare_batch set batch.input_ids ({shown}); leave "
            "it unset: the engine gathers it from the token pool through input_tuple on its own "
            "stream, and a read on the scheduler's side races the engine's write of the previous "
            "step's sample under overlap (chapter 11)"
        )


@torch.inference_mode()
def test_prepare_batch_builds_the_sampling_arguments_for_the_engines_device():
    """On a GPU, sampling arguments built for the host meet the device's logits in the sampler and
    the step fails. On a CPU both are "cpu", so the test gives the scheduler a device that differs
    from a bare `torch.device("cpu")` only by its index (cpu:0, the same memory) and records the
    device `from_params` is asked for."""
    llm = build_llm()
    distinct_scheduler_device(llm)
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(prompt_ids()[:2])]
    reqs[1].sampling_params = SamplingParams(temperature=0.7, max_tokens=4)
    with sampling_devices() as asked:
        llm._prepare_batch(Batch(reqs, "prefill"))
    assert asked, "the sampling arguments should come from BatchSamplingArgs.from_params"
    wrong = wrong_devices(asked, llm.device)
    assert not wrong, (
        f"sampling arguments built for device {wrong[0]}, the scheduler's is self.device "
        f"({llm.device}): on a GPU the sampler would meet host tensors"
    )


@torch.inference_mode()
def test_prepare_batch_sends_a_chunks_sample_to_the_scratch_row():
    llm = build_llm()
    ids = prompt_ids()[3]
    whole = _admit(llm, 0, ids, 4)
    # The first 3 prompt tokens as a chunk: its sample is junk and must not land in the prompt's
    # row.
    chunk = ChunkedReq(
        whole.input_ids[:3], whole.table_idx, 0, 4, 0, whole.sampling_params, CacheHandle(0)
    )
    fi = llm._prepare_batch(Batch([chunk], "prefill"))
    assert fi.input_tuple[1].tolist() == [0, 1, 2], (
        f"a 3-token chunk processes positions [0, 1, 2], got {fi.input_tuple[1].tolist()}"
    )
    assert fi.write_tuple[0].tolist() == [llm.engine.dummy_row], (
        f"a chunk's sample goes to the scratch row (self.engine.dummy_row = "
        f"{llm.engine.dummy_row}): write_tuple rows {fi.write_tuple[0].tolist()}, the chunk's "
        f"slot is {chunk.table_idx}"
    )
    _run(llm, fi)
    assert llm.token_pool[whole.table_idx, : len(ids)].tolist() == ids, (
        "the chunk's sample overwrote the prompt"
    )


@torch.inference_mode()
def test_prepare_batch_gives_each_request_its_sampling_arguments_in_batch_order():
    llm = build_llm()
    p = prompt_ids()[:3]
    params = [
        greedy(4),
        SamplingParams(temperature=0.7, top_k=5, max_tokens=4),
        SamplingParams(temperature=1.3, top_p=0.9, max_tokens=4),
    ]
    reqs = [_admit(llm, uid, ids, 4) for uid, ids in enumerate(p)]
    for r, sp in zip(reqs, params):
        r.sampling_params = sp
    # a batch in neither uid nor slot order (both 0, 1, 2 here): a policy that reorders its
    # requests (chapter 23's priorities, a retraction) hands the scheduler such batches
    order = [2, 0, 1]
    batch = Batch([reqs[i] for i in order], "prefill")
    got = llm._prepare_batch(batch).sample_args
    want = BatchSamplingArgs.from_params([params[i] for i in order], llm.vocab_size, llm.device)
    for field in ("temperatures", "top_k", "top_p"):
        g, w = getattr(got, field), getattr(want, field)
        shown = None if g is None else [round(x, 3) for x in g.tolist()]
        vocab = (
            f"; a top_k of -1 (off) is the model's whole vocabulary, self.vocab_size = "
            f"{llm.vocab_size} (the page table is {llm.page_table.shape[1]} wide)"
            if field == "top_k"
            else ""
        )
        assert g is not None and g.tolist() == w.tolist(), (
            f"sampling arguments, {field}: {shown}, expected "
            f"{[round(x, 3) for x in w.tolist()]} (one per request, in the batch's order: its "
            f"requests are uids {[r.uid for r in batch.reqs]}, slots "
            f"{[r.table_idx for r in batch.reqs]}){vocab}"
        )


# ---------------------------------------------------------------- DecodeManager.filter_reqs


def _req_after(uid: int, prompt_len: int, max_tokens: int, steps: int) -> Req:
    # slots are not uids: the decode set is keyed by uid (slot 7 - uid, so they never coincide)
    req = Req(
        torch.arange(prompt_len, dtype=torch.int32), 7 - uid, 0, max_tokens, uid, greedy(max_tokens)
    )
    for _ in range(steps):
        req.complete_one()
    return req


def test_filter_reqs_keeps_decodable_requests_and_drops_finished_ones():
    dm = DecodeManager()
    going = _req_after(0, 5, 3, steps=1)  # prefilled, 2 tokens to go
    one_token = _req_after(1, 4, 1, steps=1)  # prefilled, and that was its only token
    short = _req_after(2, 6, 2, steps=1)
    try:
        dm.filter_reqs([going, one_token, short])
    except KeyError as e:
        raise AssertionError(
            f"filter_reqs raised KeyError {e} on a batch where uid 1 has just produced its only "
            "token: a request that cannot decode and was never in running is simply not added "
            "(removing what is not there must not fail)"
        ) from None
    assert sorted(dm.running) == [0, 2], (
        "running should hold uids 0 and 2 (they can decode; uid 1 is finished), got "
        f"{list(dm.running)}"
    )

    chunk = ChunkedReq(torch.arange(3, dtype=torch.int32), 5, 0, 4, 3, greedy(4))
    chunk.complete_one()
    dm.filter_reqs([chunk])
    assert {0, 2} <= set(dm.running), (
        f"after filter_reqs([a chunk]) running is {list(dm.running)}, expected uids 0 and 2 still "
        "there: filter_reqs changes only the requests of the batch it is given (a running set "
        "rebuilt from the batch loses every request outside it)"
    )
    assert sorted(dm.running) == [0, 2], (
        f"a chunked prefill is not decoding yet: running is {list(dm.running)}"
    )

    going.complete_one()
    short.complete_one()  # short reaches its max_tokens on this step
    dm.filter_reqs([going, short])
    assert list(dm.running) == [0], (
        "a request that reached max_tokens must leave the decode set: running is "
        f"{list(dm.running)}, expected [0]"
    )
    assert dm.running[0] is going, "running[uid] should be the request itself"
    batch = dm.schedule_next_batch()
    assert batch is not None and batch.reqs == [going] and batch.is_decode, (
        "the next decode batch should hold exactly the request still running"
    )

    going.complete_one()
    dm.filter_reqs([going])
    assert not dm.running, (
        f"every request reached max_tokens, but running still holds {list(dm.running)}"
    )
    assert dm.schedule_next_batch() is None, (
        "no request can decode: there should be no decode batch"
    )


def test_filter_reqs_reads_its_requests_once():
    """`reqs` is an Iterable: one pass over it. A generator given to an answer that reads it twice
    (an adding pass, then a removing one) is empty the second time, and a request that has reached
    max_tokens stays running: it would be scheduled for a token past its max_tokens."""
    dm = DecodeManager()
    going, short = _req_after(0, 5, 3, steps=1), _req_after(2, 6, 2, steps=1)
    dm.filter_reqs(iter([going, short]))
    assert sorted(dm.running) == [0, 2], (
        f"after filter_reqs(a generator of uids 0 and 2, both able to decode) running is "
        f"{list(dm.running)}, expected [0, 2]"
    )
    going.complete_one()
    short.complete_one()  # short reaches its max_tokens on this step
    dm.filter_reqs(r for r in (going, short))
    assert list(dm.running) == [0], (
        f"filter_reqs(a generator of uids 0 and 2, 2 at its max_tokens): running is "
        f"{list(dm.running)}, expected [0]: reqs is an Iterable, readable once (a generator is "
        "empty the second time), so each request is added or removed in one pass over it"
    )


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
    want = [
        ("prefill", [a, b]),
        ("decode", [a, b]),
        ("prefill", [c]),
        ("decode", [a, c]),
        ("decode", [a, c]),
        ("decode", [a, c]),
        ("decode", [a]),
    ]
    # which requests each batch holds, not their order inside a decode batch: every row carries
    # its own slot, so running's order changes no token (the chapter says it is not a rule)
    got = [(phase, uids if phase == "prefill" else sorted(uids)) for phase, uids in launches(log)]
    assert got == want, (
        "the batches' composition over time is not what continuous batching gives: launched "
        f"(phase, uids) {got}, expected {want} (a arrives wanting 6 tokens, b 2, c 4 after step 2)"
    )

    ref = hf_greedy([p[0], p[1], p[3]], 6)
    got = [llm.results[u].token_ids for u in (a, b, c)]
    assert_tokens_equal(got, [ref[0][:6], ref[1][:2], ref[2][:4]])
    assert all(llm.results[u].finished for u in (a, b, c)), "every request should be finished"
    assert_all_returned(llm)


def test_normal_loop_handles_each_step_before_launching_the_next():
    llm = build_llm()
    log = llm.events.record()
    p = prompt_ids()
    llm.generate(p[:2], greedy(3))
    order = [(e.kind, e["step"]) for e in log if e.kind in ("launch", "handle")]
    steps = [s for kind, s in order if kind == "launch"]
    assert len(steps) == 3, f"expected one prefill and two decode steps, got {order}"
    assert order == [(kind, s) for s in steps for kind in ("launch", "handle")], (
        f"the normal loop must handle step N's results before it launches step N+1: {order}"
    )


def test_one_step_processes_messages_and_runs_one_batch():
    llm = build_llm()
    log = llm.events.record()
    uid = llm.add_request(prompt_ids()[0], greedy(3))
    llm.step()
    assert launches(log) == [("prefill", [uid])], (
        f"one step should launch one prefill batch, got {launches(log)}"
    )
    assert len(llm.results[uid].token_ids) == 1, "the prefill step's token should have arrived"
    llm.step()
    assert launches(log)[1:] == [("decode", [uid])], (
        f"the second step should launch one decode batch, got {launches(log)[1:]}"
    )
    assert len(llm.results[uid].token_ids) == 2, "after two steps the request should have 2 tokens"
    llm.step()
    got = llm.results[uid]
    assert got.finished and len(got.token_ids) == 3, (
        f"after three steps: {len(got.token_ids)} tokens, finished={got.finished}; expected 3 "
        "tokens, finished"
    )
    assert not llm.busy, "the only request is done, yet the LLM still has work"
    llm.step()  # nothing to do: no batch, no error
    assert len(launches(log)) == 3, "a step with nothing to do launched a batch"
    assert_all_returned(llm)


class InOrderStream(DeferredStream):
    """A deferred CPU stream whose `wait_stream` behaves like a GPU's: it orders only the work
    launched here *after* the wait behind `other`'s work launched before it."""

    def wait_stream(self, other) -> None:
        upto = other._launched
        self.launch(lambda: other.run_until(upto))


class IndicesCopiedOnTheSchedulerStream(LLM):
    """As on a GPU: the index tensors of a step reach the device through copies queued on the
    scheduler's stream, so the engine may read them only after waiting for that stream. On the
    CPU the streams are deferred stand-ins; on a GPU a sleep kernel makes the copies arrive late."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not self.engine.kit.is_cuda:
            self.engine.stream = InOrderStream()

    def _prepare_batch(self, batch):
        fi = super()._prepare_batch(batch)
        self._check_prepared(fi, batch)  # a field left unset is _prepare_batch's, not the wait's
        # each tensor once (batch.positions may be input_tuple[1] itself)
        tensors = list(
            {
                id(t): t for t in (*fi.input_tuple, *fi.write_tuple, batch.positions, batch.out_loc)
            }.values()
        )
        values = [t.clone() for t in tensors]
        for t in tensors:
            t.zero_()  # what the device holds until the copies have arrived

        def arrive() -> None:
            if self.engine.kit.is_cuda:
                torch.cuda._sleep(100_000_000)  # ~50 ms: the engine would run long before
            for t, v in zip(tensors, values):
                t.copy_(v)

        self.stream.launch(arrive)
        return fi


def test_the_engine_stream_waits_for_the_scheduler_stream_before_each_step():
    llm = build_llm(llm_class=IndicesCopiedOnTheSchedulerStream, cpu_streams="deferred")
    p = prompt_ids()[:2]
    got, want = [o["token_ids"] for o in llm.generate(p, greedy(3))], hf_greedy(p, 3)
    if got != want:
        # blame the wait only if the indices are right when nothing delays them
        plain = [o["token_ids"] for o in build_llm().generate(p, greedy(3))]
        assert_tokens_equal(
            plain,
            want,
            "with no copy delayed (plain CPU streams), so the wait for the scheduler stream is not "
            "the cause: the step's index tensors themselves are wrong (_prepare_batch's rules)",
        )
    assert_tokens_equal(
        got,
        want,
        "the step's indices are copied on the scheduler stream: the engine stream must wait for it "
        "before each launch, after the step is prepared (a wait queued before "
        "_schedule_next_batch orders none of that step's copies)",
    )


class RecordingIO:
    """The scheduler's IO, recording whether each receive would block (a server waits there)."""

    def __init__(self, llm) -> None:
        self.inner, self.llm, self.calls = llm.io, llm, []

    def receive(self, blocking: bool):
        self.calls.append((blocking, self.llm.has_work))
        return self.inner.receive(blocking)

    def send(self, msgs) -> None:
        self.inner.send(msgs)


@pytest.mark.parametrize("chunked", [False, True], ids=["whole prompts", "a prompt in chunks"])
def test_the_loop_blocks_for_messages_only_when_it_has_no_work(chunked):
    """Between the chunks of a chunked prefill nothing is running, yet work is pending: a loop
    that blocks while nothing runs would stall there, waiting for a message that may never come."""
    llm = build_llm(max_extend_tokens=8) if chunked else build_llm()
    io = llm.io = RecordingIO(llm)
    starts, loop = [], llm.normal_loop  # the receives recorded before each turn began

    def one_turn():
        starts.append(len(io.calls))
        loop()

    llm.normal_loop = one_turn
    prompts = prompt_ids()[:1] if chunked else prompt_ids()[:2]
    if chunked:
        assert len(prompts[0]) > 8, f"the test needs a prompt longer than a chunk, got {prompts}"
    llm.generate(prompts, greedy(3))
    llm.step()  # idle: a server would wait here for the next message
    # the first rule: one receive a turn, its blocking decided before it
    per_turn = [io.calls[a:b] for a, b in zip(starts, starts[1:] + [len(io.calls)])]
    many = next(((t, calls) for t, calls in enumerate(per_turn, 1) if len(calls) != 1), None)
    assert many is None, (
        f"turn {many[0]} of {len(per_turn)} did {len(many[1])} receives: "
        + ", then ".join("a blocking receive" if b else "a poll" for b, _ in many[1])
        + " (one receive a turn: whether it blocks is decided before it, from has_work; a poll "
        "that finds nothing and then a blocking receive are two)"
    )
    wrong = [(blocking, work) for blocking, work in io.calls if blocking == work]
    assert not wrong, (
        f"{len(wrong)} of {len(io.calls)} receives: blocking={wrong[0][0]} with "
        f"{'work' if wrong[0][1] else 'no work'} to do, in a run of "
        f"{'one prompt prefilled in chunks of 8 tokens' if chunked else 'two whole prompts'} "
        "(block only when there is no work: nothing running is not the same when a prompt still "
        "waits for its next chunk"
        + (
            "; and one receive a turn, its blocking decided before it: a poll and then a "
            "blocking receive are two)"
            if not wrong[0][0]
            else ")"
        )
    )
    assert io.calls and io.calls[-1] == (True, False), "an idle step should wait for messages"


def test_a_message_the_scheduler_cannot_process_stops_the_step_with_its_error():
    """`_process_one_msg` raises TypeError on an object that is no message: a loop that swallows it
    would run on as if the sender's bug (a server handing the scheduler the wrong object) had never
    happened, and the request that object stood for would wait forever."""
    llm = build_llm()
    uid = llm.add_request(prompt_ids()[0], greedy(2))
    stray = ("not", "a", "message")
    llm._queue.put(stray)
    what = (
        f"a turn of normal_loop whose messages include {stray!r} (the TypeError "
        "_process_one_msg raises for it must reach the caller, not be skipped)"
    )
    with refuses(TypeError, what, match="unknown message"):
        llm.step()
    assert uid in llm.results, "the request queued before the stray object should still be known"


@pytest.mark.parametrize("ending", ["finishes", "is aborted"])
def test_a_slot_freed_in_the_normal_loop_is_reused_at_once_even_after_overlap_steps(ending):
    """The overlap loop of chapter 11 delays slot reuse; the normal loop must not, whatever ran
    before it (an LLM can switch loops between steps), also for a slot freed by an abort message."""
    p = prompt_ids()
    llm = build_llm(max_running_req=1)
    first = llm.add_request(p[0], greedy(2))
    second = llm.add_request(p[1], greedy(2))
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    llm.step()  # the overlap loop launches the first prefill
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    if ending == "is aborted":
        llm.abort(first)  # its slot is freed while the next step takes in its messages
    for _ in range(4):  # enough steps for the second request, if it gets the slot at once
        llm.step()
    got = llm.results[second].token_ids
    assert llm.results[second].finished, (
        f"after the first request {ending}, the second waited for its slot (got {len(got)} of "
        "2 tokens): the flag `_defer_slot_free` must be False for the whole of a normal step, "
        "wherever a slot may be freed (the overlap step before it left it True; an abort frees "
        "the slot while the turn's messages are processed), or the slot is parked in the "
        "deferred list"
    )
    assert_tokens_equal([got], hf_greedy([p[1]], 2), "the request that waited for the freed slot")
    if ending == "finishes":
        assert_tokens_equal(
            [llm.results[first].token_ids], hf_greedy([p[0]], 2), "the first request"
        )
    assert_all_returned(llm)


def test_a_request_that_samples_end_of_text_stops_while_the_others_go_on():
    p = prompt_ids()
    ref = hf_greedy([p[3]], 6)[0]
    k = next(k for k in range(1, len(ref)) if ref[k] not in ref[:k])  # its first time at index k
    llm = build_llm(max_running_req=2)
    llm.eos_token_ids = {ref[k]}
    short = llm.add_request(p[0], greedy(1))
    long_ = llm.add_request(p[1], greedy(6))
    # arrives while both slots are taken; gets the short one's slot, so its uid differs from its
    # slot
    stops = llm.add_request(p[3], SamplingParams(max_tokens=6))
    llm.run_until_idle()
    got = llm.results[stops].token_ids
    assert got == ref[: k + 1], (
        f"the request whose token {k} is end-of-text got {len(got)} tokens, expected {k + 1} "
        "(it stops there)"
    )
    assert llm.results[stops].finished, "the request that sampled end-of-text is not finished"
    assert_tokens_equal(
        [llm.results[short].token_ids, llm.results[long_].token_ids],
        [hf_greedy([p[0]], 1)[0], hf_greedy([p[1]], 6)[0]],
        "the two requests that ignore end-of-text",
    )
    assert_all_returned(llm)


def test_each_launch_logs_the_tokens_it_processed_and_prompt_logprobs_arrive():
    """What reads the lengths after a step is prepared: the launch event's extend_lens, and the
    slice of prompt logprobs a request asked for."""
    llm = build_llm()
    log = llm.events.record()
    p = prompt_ids()[:2]
    out = llm.generate(p, SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=True))
    lens = launches_with_lens(log)
    assert lens == [[len(q) for q in p], [1, 1]], (
        f"tokens processed per request, per launch: {lens}, expected "
        f"{[[len(q) for q in p], [1, 1]]} (the prompts, then one token each)"
    )
    got = [len(o.get("prompt_logprobs") or []) for o in out]
    assert got == [len(q) for q in p], (
        f"prompt logprobs per request: {got} entries, expected {[len(q) for q in p]} (one per "
        "prompt token, the first None)"
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_prompt_whose_start_is_cached_is_prefilled_from_where_the_cache_ends(page_size):
    """With a prefix cache hit a request's cached_len is above 0 at its prefill: it processes only
    positions cached_len .. device_len - 1, next to a request with a different cached length."""
    llm = build_llm(page_size=page_size)
    p = prompt_ids()
    llm.generate([p[0]], greedy(2))  # leaves p[0] in the prefix cache
    log = llm.events.record()
    prompts = [p[2], p[0] + [5, 6]]  # p[2] is a prefix of p[0]; the other extends it
    out = llm.generate(prompts, greedy(3))
    first = launches_with_lens(log)[0]
    assert all(n < len(q) for n, q in zip(first, prompts)), (
        f"the prefix cache should have served part of these prompts (prefill lengths {first})"
    )
    assert_tokens_equal(
        [o["token_ids"] for o in out], hf_greedy(prompts, 3), "prompts with a cached start"
    )
    assert_all_returned(llm)


def _first_difference(got: List[int], want: List[int]) -> str:
    """Where a request's tokens first leave Hugging Face's, with both up to just past there."""
    pos = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    what = (
        f"token {pos} is {got[pos]}, Hugging Face gives {want[pos]}"
        if pos < min(len(got), len(want))
        else f"{len(got)} tokens, Hugging Face gives {len(want)}"
    )
    return f"{what} (got {got[: pos + 3]}, expected {want[: pos + 3]})"


def test_each_request_is_sampled_with_its_own_settings():
    """A batch mixing greedy and sampled requests: the greedy ones still match Hugging Face, and
    the sampled one is really sampled (at temperature 5, eight argmax tokens in a row do not
    happen)."""
    llm = build_llm()
    p = prompt_ids()
    hot = SamplingParams(temperature=5.0, max_tokens=8, ignore_eos=True)
    for params in ([greedy(8), hot, greedy(8)], [hot, greedy(8), greedy(8)]):
        out = [o["token_ids"] for o in llm.generate(p[:3], params)]
        ref = hf_greedy(p[:3], 8)
        for i, sp in enumerate(params):
            if sp is hot:
                assert out[i] != ref[i], (
                    f"request {i} (temperature 5) got the greedy tokens: it was not sampled"
                )
            else:
                assert out[i] == ref[i], (
                    f"greedy request {i}, in a batch with a sampled one: "
                    f"{_first_difference(out[i], ref[i])}"
                )


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
        assert isinstance(o["text"], str) and o["text"] == llm.decode(o["token_ids"]), (
            "text should decode token_ids"
        )
    single = llm.generate(PROMPT_TEXTS[1], greedy(6))  # one prompt, not in a list
    assert len(single) == 1, f"a single prompt (not in a list) gives one output, got {len(single)}"
    # the same prompt a second time: its start is now in the prefix cache, so this prefill starts
    # at cached_len, not at position 0, in whatever slot the request got
    got = single[0]["token_ids"]
    assert got == ref[1], (
        "the same prompt again, its start now in the prefix cache (its tokens are read from "
        f"cached_len on, in its own slot's row): {_first_difference(got, ref[1])}"
    )


def test_more_prompts_than_request_slots_queue_up():
    llm = build_llm(max_running_req=2)
    log = llm.events.record()
    p = prompt_ids()
    out = llm.generate(p, greedy(5))
    assert_tokens_equal([o["token_ids"] for o in out], hf_greedy(p, 5))
    batches = launches(log)
    assert max(len(uids) for _, uids in batches) == 2, (
        "at most max_running_req requests may run at once"
    )
    slots = {e["table_idx"] for e in log if e.kind == "slot_alloc"}
    assert slots == {0, 1}, f"the two slots should be reused by the waiting requests, got {slots}"
    assert_all_returned(llm)


@pytest.mark.parametrize(
    "case", ["empty", "too_long", "id_too_large", "negative_id", "not_ints", "mismatched"]
)
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
        with refuses(
            ValueError, "generate of 2 prompts with 1 SamplingParams", match="2 prompts but 1"
        ):
            llm.generate(good, [greedy(3)])
    else:
        ids, words = bad[case]
        with refuses(ValueError, f"generate with prompt 1 {case}", match=f"prompt 1: .*{words}"):
            llm.generate([good[0], ids], greedy(3))
    assert not llm.results and not llm.busy, "a refused generate call must queue nothing"

    out = llm.generate(good, greedy(3))
    assert_tokens_equal([o["token_ids"] for o in out], hf_greedy(good, 3))
    assert_all_returned(llm)
