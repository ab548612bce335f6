"""Scheduling under load: the cache-aware order of the waiting queue (minisgl/scheduler/policy.py)
and optimistic admission with retraction (minisgl/scheduler/retract.py).

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
from minisgl.scheduler.load import PlannedReq
from torture.prompts import load_pool
from torture.runner import run_workload
from torture.workload import generate

# ---------------------------------------------------------------- cache-aware order


def _tenants():
    """Two tenants with long system prompts sharing nothing, requests interleaved A, B, A, B..."""
    p = prompt_ids()
    system = {"A": p[0] + p[1] + p[3], "B": p[3] + p[1] + p[0] + p[3]}
    prompts = []
    for i in range(8):
        tenant = "AB"[i % 2]
        prompts.append(system[tenant] + p[2][i % 3 : i % 3 + 2])
    return prompts


def _prefill_tokens(log) -> int:
    return sum(sum(e["extend_lens"]) for e in log if e.kind == "launch" and e["phase"] == "prefill")


def _run_policy(policy: str, **options):
    prompts = _tenants()
    longest = max(len(x) for x in prompts) + 4
    # one request and one tenant's cached prompt fit; the other tenant's prompt is evicted
    llm = build_llm(
        max_running_req=1, num_page_override=longest + 30, schedule_policy=policy, **options
    )
    log = llm.events.record()
    out = [o["token_ids"] for o in llm.generate(prompts, greedy(4))]
    llm.cache_manager.check_integrity()
    return out, _prefill_tokens(log)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_lpm_computes_fewer_prefill_tokens_than_fcfs(overlap):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    fcfs_out, fcfs_tokens = _run_policy("fcfs")
    lpm_out, lpm_tokens = _run_policy("lpm")
    assert lpm_out == fcfs_out
    # FCFS alternates tenants, and each evicts the other's prompt: every request computes its
    # whole prompt. lpm runs a tenant's requests while its prompt is cached.
    assert lpm_tokens * 2 < fcfs_tokens, f"prefill tokens: lpm {lpm_tokens}, fcfs {fcfs_tokens}"


def test_lpm_falls_back_to_fcfs_past_its_queue_limit():
    _, fcfs_tokens = _run_policy("fcfs")
    _, lpm_tokens = _run_policy("lpm")
    _, never = _run_policy("lpm", lpm_max_queue=0)  # every queue is past the limit
    _, late = _run_policy("lpm", lpm_max_queue=3)  # FCFS until only 3 wait
    assert never == fcfs_tokens
    assert lpm_tokens < late < fcfs_tokens, (lpm_tokens, late, fcfs_tokens)


def test_lpm_keeps_a_started_chunk_and_a_retracted_request_first():
    from minisgl.scheduler.policy import order_queue

    llm = build_llm(cache_type="radix")
    cached = torch.arange(10, 30, dtype=torch.int32)
    llm.generate([cached.tolist()], greedy(1))  # its prompt is cached now
    params = greedy(2)
    fresh = PlannedReq(1, torch.arange(40, 50, dtype=torch.int32), params)
    retracted = PlannedReq(2, torch.arange(60, 70, dtype=torch.int32), params, retractions=1)
    hit = PlannedReq(3, torch.cat([cached, torch.tensor([5], dtype=torch.int32)]), params)
    order = order_queue([fresh, retracted, hit], llm.cache_manager, "lpm", 128)
    assert [p.uid for p in order] == [2, 3, 1]
    assert [p.uid for p in order_queue([fresh, hit], llm.cache_manager, "fcfs", 128)] == [1, 3]


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
