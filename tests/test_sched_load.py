"""Scheduling under load: optimistic admission with retraction (minisgl/scheduler/retract.py), the
features' options; the cache-aware order is tested in tests/test_ch23_order.py.

The retraction tests run requests on a pool too small for all of them with the estimate held at
0.1 of max_tokens, so decode steps run out of pages and retract; the outputs must be an unpressured
run's. The bug classes production engines have had with retraction (double frees through the prefix
cache, requests lost or duplicated on requeue, stale KV read after it) are each put back in a
known-wrong `_retract`, which the retracting torture workloads must catch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from helpers import MODEL, build_llm, greedy, prompt_ids, test_device
from minisgl import SamplingParams
from minisgl.env import ENV
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.planned import PlannedReq
from torture.prompts import load_pool
from torture.runner import run_workload
from torture.workload import generate

# ---------------------------------------------------------------- optimistic admission
# (the cache-aware order is chapter 23's exercise: tests/test_ch23_order.py)


def test_the_token_ratio_learns_from_ended_requests_and_retractions():
    from minisgl.scheduler.retract import TokenRatio

    ratio = TokenRatio(initial=0.7)
    ratio.observe(used=10, asked=100)  # a tenth of the way to 0.1
    assert ratio.value == pytest.approx(0.64)
    ratio.retracted()  # half the way to 1
    assert ratio.value == pytest.approx(0.82)
    for _ in range(200):
        ratio.observe(used=0, asked=100)
    assert ratio.value == pytest.approx(0.1)  # the floor
    ratio.learn = False
    ratio.retracted()
    assert ratio.value == pytest.approx(0.1)


@pytest.mark.parametrize(
    "option,value,says",
    [
        ("schedule_policy", "sjf", "schedule_policy"),
        ("lpm_max_queue", -1, "lpm_max_queue"),
        ("max_retractions", 1.5, "max_retractions"),
        ("init_new_token_ratio", 0, "init_new_token_ratio"),
        ("optimistic_admission", "yes", "optimistic_admission"),
    ],
)
def test_bad_scheduling_options_are_refused(option, value, says):
    with pytest.raises((ValueError, TypeError), match=says):
        SchedulerConfig(model_path=MODEL, **{option: value})


# ---------------------------------------------------------------- retraction


def _pressured_prompts():
    base = prompt_ids()
    return [base[i % 4] + base[(i + 1) % 4][: i + 1] for i in range(8)]


def _params(n: int):
    seeded = SamplingParams(max_tokens=n - 4, temperature=0.8, seed=7, ignore_eos=True)
    return [greedy(n) if i % 2 == 0 else seeded for i in range(8)]


def _pressured_llm(page_size=1, cache_type="radix", **options):
    settings = dict(optimistic_admission=True, init_new_token_ratio=0.1)
    settings.update(options)
    llm = build_llm(
        max_running_req=8,
        page_size=page_size,
        num_page_override=72 // page_size,
        cache_type=cache_type,
        max_extend_tokens=16,
        **settings,
    )
    llm.token_ratio.learn = False  # keep admitting too much: retractions all the way
    return llm


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("page_size,cache_type", [(1, "radix"), (4, "radix"), (1, "naive")])
def test_retraction_keeps_greedy_and_seeded_outputs(overlap, page_size, cache_type):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    prompts, params = _pressured_prompts(), _params(40)
    want = [o["token_ids"] for o in build_llm(max_running_req=8).generate(prompts, params)]
    llm = _pressured_llm(page_size, cache_type)
    log = llm.events.record()
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    assert llm.retracted_total >= 3, f"only {llm.retracted_total} retractions: no pressure"
    assert got == want
    running = max(len(e["uids"]) for e in log if e.kind == "launch" and e["phase"] == "decode")
    assert running >= 3  # optimistic admission ran more at once than reserve-all could (2)
    llm.cache_manager.check_integrity()
    assert llm.table_manager.available_size == llm.config.max_running_req
    assert not llm.retractions and not llm._prompt_lens  # nothing left behind


def test_reserve_all_never_retracts_and_runs_fewer_at_once():
    prompts, params = _pressured_prompts(), _params(40)
    llm = _pressured_llm(optimistic_admission=False)
    log = llm.events.record()
    llm.generate(prompts, params)
    running = max(len(e["uids"]) for e in log if e.kind == "launch" and e["phase"] == "decode")
    assert llm.retracted_total == 0 and running <= 2


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_retractions_per_request_are_bounded(bound):
    prompts, params = _pressured_prompts(), _params(40)
    llm = _pressured_llm(max_retractions=bound)
    log = llm.events.record()
    want = [o["token_ids"] for o in build_llm(max_running_req=8).generate(prompts, params)]
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    per_uid = Counter(e["uid"] for e in log if e.kind == "retract")
    assert got == want
    assert max(per_uid.values(), default=0) <= bound, f"retractions per uid: {dict(per_uid)}"
    if bound == 0:
        assert not per_uid
    else:
        assert max(per_uid.values()) == bound, "no request reached the bound: the test is weak"


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_a_retracted_request_can_be_aborted_while_it_waits(overlap):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    prompts, params = _pressured_prompts(), _params(40)
    llm = _pressured_llm()
    aborted = []

    def on_event(ev):
        if ev.kind == "retract" and not aborted:
            aborted.append(ev["uid"])
            llm.abort(ev["uid"])

    llm.events.subscribe(on_event)
    log = llm.events.record()
    uids = [llm.add_request(x, p) for x, p in zip(prompts, params)]
    llm.run_until_idle()
    (uid,) = aborted
    assert [e["state"] for e in log if e.kind == "abort"] == ["queued"]
    sends = [m for e in log if e.kind == "send" for m in e["msgs"] if m.uid == uid]
    assert not any(m.finished for m in sends)
    for u in uids:
        if u != uid:
            assert llm.results[u].finished
    llm.cache_manager.check_integrity()
    assert llm.table_manager.available_size == llm.config.max_running_req


def test_a_stop_string_that_spans_a_retraction_is_found():
    """The output of a resumed request starts where the client's prompt ended, not where the
    resumed prompt does: a stop string made of tokens from before and after a retraction ends it."""
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    prompts, params = _pressured_prompts(), _params(40)
    llm = _pressured_llm()
    log = llm.events.record()
    full = [o["token_ids"] for o in llm.generate(prompts, params)]
    first = next(e for e in log if e.kind == "retract")
    i = first["uid"]  # a fresh LLM numbers its requests from 0
    done = first["tokens"] - len(prompts[i])  # tokens it had generated when retracted
    assert 1 <= done < len(full[i])
    stop = llm.stops.tokenizer.decode(full[i][done - 1 : done + 1])
    params[i] = replace(params[i], stop=[stop])
    out = _pressured_llm().generate(prompts, params)
    assert len(out[i]["token_ids"]) <= done + 1, f"{stop!r} did not stop uid {i}"


# ---------------------------------------------------------------- known-wrong retractions


def _wrong_retract(bug: str):
    """A `_retract` with one bug of a class production engines have had."""

    def _retract(self, req):
        uid = req.uid
        self._prompt_lens.setdefault(uid, self._prompt_len(req))
        count = self.retractions.get(uid, 0) + 1
        self.retractions[uid] = count
        self.retracted_total += 1
        if bug != "duplicated":  # the request stays running *and* is requeued
            self._live.pop(uid, None)
            self.decode_manager.remove_req(req)
            self.finished_reqs.add(req)
        if self._defer_slot_free:
            self._deferred_slots.append((req.table_idx, uid))
        else:
            self.table_manager.free(req.table_idx, uid)
        if bug == "double_free":  # freed as an uncached request, then cached as a finished one
            p = self.cache_manager.page_size
            start = req.cache_handle.cached_len
            end = req.cached_len - req.cached_len % p
            self.cache_manager._free_locations(self.page_table[req.table_idx, start:end].clone())
        if bug == "stale_kv":  # the prefix cache takes a position whose KV was never written
            req.cached_len = min(req.device_len, len(req.input_ids))
        self.cache_manager.cache_req(req, finished=True)
        if bug == "lost":
            return
        prompt = req.input_ids.clone()
        params = replace(
            req.sampling_params, max_tokens=req.max_device_len - len(prompt), prompt_logprobs=False
        )
        self.prefill_manager.pending.insert(0, PlannedReq(uid, prompt, params, retractions=count))
        self.events.emit("retract", uid=uid, count=count, tokens=len(prompt))

    from minisgl.llm import LLM

    return type(f"LLM_retract_{bug}", (LLM,), {"_retract": _retract})


@pytest.mark.parametrize("bug", ["double_free", "lost", "duplicated", "stale_kv"])
def test_the_retracting_torture_catches_each_retraction_bug(bug):
    pool = load_pool(MODEL)
    cls = _wrong_retract(bug)
    for seed in range(24):
        wl = generate(seed, pool, max_requests=6, retracting=True)
        if run_workload(wl, pool, MODEL, test_device(), cls).failure is not None:
            return
    pytest.fail(f"{bug}: no failure in 24 retracting workloads")


def test_serve_passes_the_scheduling_options(monkeypatch):
    import minisgl.server.launcher as launcher
    from minisgl.__main__ import main

    seen = {}
    monkeypatch.setattr(launcher, "serve", lambda args, log_level: seen.update(args.engine) or 0)
    main(["serve", "--schedule-policy", "lpm", "--optimistic-admission"])
    assert seen == {"schedule_policy": "lpm", "optimistic_admission": True}
    seen.clear()
    main(["serve", "--no-optimistic-admission"])
    assert seen == {"optimistic_admission": False}


# ---------------------------------------------------------------- mixed batches


def _staggered(llm, prompts, n):
    """Two requests start decoding; the others arrive while they decode (one every other step)."""
    uids = [llm.add_request(x, greedy(n)) for x in prompts[:2]]
    for x in prompts[2:]:
        for _ in range(2):
            llm.step()
        uids.append(llm.add_request(x, greedy(n)))
    llm.run_until_idle()
    return [llm.results[u].token_ids for u in uids]


def _mixed_steps(log) -> int:
    """Prefill-phase steps that carried a request that had received a token (a decoder)."""
    decoding, mixed = set(), 0
    for e in log:
        if e.kind == "launch":
            mixed += e["phase"] == "prefill" and bool(decoding & set(e["uids"]))
        elif e.kind == "send":
            decoding |= {m.uid for m in e["msgs"] if not m.finished}
            decoding -= {m.uid for m in e["msgs"] if m.finished}
    return mixed


def _long_prompts():
    p = prompt_ids()
    return [p[0], p[3], p[1] * 3 + p[0], p[2] * 4, p[3] + p[1] * 3]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize(
    "cache_type,page_size,chunk", [("radix", 1, 8), ("radix", 4, 5), ("naive", 1, 16)]
)
def test_mixed_batches_give_the_unmixed_schedulers_tokens(overlap, cache_type, page_size, chunk):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    prompts = _long_prompts()

    def run(mixed):
        llm = build_llm(
            cache_type=cache_type, page_size=page_size, max_extend_tokens=chunk, mixed_batches=mixed
        )
        log = llm.events.record()
        out = _staggered(llm, prompts, 12)
        llm.cache_manager.check_integrity()
        assert llm.table_manager.available_size == llm.config.max_running_req
        return out, _mixed_steps(log)

    want, unmixed = run(False)
    got, mixed = run(True)
    assert unmixed == 0 and mixed >= 3, f"mixed steps: {mixed} (unmixed run: {unmixed})"
    assert got == want


def test_mixed_batches_give_transformers_tokens():
    from helpers import assert_tokens_equal, hf_greedy

    prompts = _long_prompts()
    llm = build_llm(max_extend_tokens=8, mixed_batches=True)
    assert_tokens_equal(_staggered(llm, prompts, 12), hf_greedy(prompts, 12))


def test_mixed_batches_keep_decoding_while_a_long_prompt_is_chunked():
    """Unmixed, the decoders wait through every chunk of a long prompt; mixed, they decode in each
    of its steps, and no step exceeds the token budget."""
    p = prompt_ids()

    def gaps(mixed):
        llm = build_llm(max_extend_tokens=6, mixed_batches=mixed)
        log = llm.events.record()
        first = llm.add_request(p[3], greedy(20))
        llm.step()
        llm.step()
        llm.add_request(p[0] * 4, greedy(2))
        llm.run_until_idle()
        steps = [e for e in log if e.kind == "launch"]
        assert all(sum(e["extend_lens"]) <= 6 for e in steps)
        runs = [first in e["uids"] for e in steps]
        longest, cur = 0, 0
        for r in runs:
            cur = 0 if r else cur + 1
            longest = max(longest, cur)
        return longest

    assert gaps(False) >= 5
    assert gaps(True) == 0


@pytest.mark.gpu
def test_mixed_batches_on_the_triton_backend():
    """The engine on the Triton backend (CUDA only) gives transformers' tokens with mixed
    batches."""
    from helpers import assert_tokens_equal, hf_greedy

    prompts = _long_prompts()[:4]
    llm = build_llm(attention_backend="triton", max_extend_tokens=8, mixed_batches=True)
    assert llm.engine.backend_name == "triton"
    log = llm.events.record()
    got = _staggered(llm, prompts, 6)
    assert _mixed_steps(log) >= 2
    assert_tokens_equal(got, hf_greedy(prompts, 6))


def test_the_triton_prefill_kernel_computes_a_mixed_batch():
    """A mixed batch's decodes are one-token prefills over a cached prefix: the Triton backend's
    prefill path gives the torch backend's attention for them and for the prompt pieces beside
    them (in Triton's interpreter on a CPU)."""
    pytest.importorskip("triton")
    from minisgl.attention import TorchAttentionBackend, prepare_metadata
    from minisgl.attention.triton_backend import TritonAttentionBackend
    from minisgl.core import Batch, Req
    from minisgl.kvcache import KVCache
    from test_ch17_gpu_attention import DIM, assert_attention, device

    dev = device()
    page, heads, kv_heads = 4, 4, 2
    pool = KVCache(1, 32, page, kv_heads, DIM, torch.float32, dev)
    table = torch.zeros(4, 40, dtype=torch.int32, device=dev)
    free = list(torch.randperm(32, generator=torch.Generator().manual_seed(3)).tolist())
    g = torch.Generator().manual_seed(11)
    # (row, length, cached): a chunk after a cached prefix, a fresh prompt, two decodes
    specs = [(3, 13, 5), (0, 7, 0), (1, 20, 19), (2, 9, 8)]
    reqs = []
    for uid, (row, length, cached) in enumerate(specs):
        pages = [free.pop(0) for _ in range(-(-length // page))]
        locs = torch.tensor([pages[p // page] * page + p % page for p in range(length)])
        table[row, :length] = locs.to(torch.int32).to(dev)
        pool.k_cache(0)[locs.to(dev)] = torch.randn(length, kv_heads, DIM, generator=g).to(dev)
        pool.v_cache(0)[locs.to(dev)] = torch.randn(length, kv_heads, DIM, generator=g).to(dev)
        ids = torch.arange(length, dtype=torch.int32)
        reqs.append(Req(ids, row, cached, 4, uid, SamplingParams()))
    batch = Batch(reqs, "prefill")
    batch.attn_metadata = prepare_metadata(batch, table, dev)
    q = torch.randn(sum(r.extend_len for r in reqs), heads, DIM, generator=g).to(dev)
    torch_backend = TorchAttentionBackend(pool, heads, kv_heads, DIM)
    triton_backend = TritonAttentionBackend(pool, heads, kv_heads, DIM, table)
    assert_attention(
        triton_backend.attend(q, 0, batch),
        torch_backend.attend(q, 0, batch),
        "a mixed batch: 8 new tokens after 5 cached, 7 fresh, two decodes of 20 and 9 keys",
        "the Triton backend gives the torch backend's attention",
        new=[8, 7, 1, 1],
    )


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_constrained_requests_keep_their_output_through_retraction_and_mixing(overlap):
    """A constrained request's grammar state lives by uid: a retraction drops the token in flight
    before the grammar took it, and the resumed request recomputes it under the same mask."""
    pytest.importorskip("llguidance")
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    prompts = _pressured_prompts()
    regex = SamplingParams(max_tokens=30, constraint={"regex": "[a-z ]{5,40}"})
    params = [regex if i % 3 == 0 else greedy(36) for i in range(8)]
    want = [o["token_ids"] for o in build_llm(max_running_req=8).generate(prompts, params)]
    llm = _pressured_llm(mixed_batches=True)
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    assert llm.retracted_total >= 2
    assert got == want
    llm.cache_manager.check_integrity()
