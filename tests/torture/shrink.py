"""Cut a failing workload down while it still fails the same way.

Greedy, one change at a time, biggest cuts first: drop requests, aborts and oddities; then make what
is left plainer (earlier arrivals, fewer tokens, shorter prompts, greedy sampling, a simpler engine
setup). A change is kept when the run still fails with the same kind of violation.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterator

from .prompts import PromptPool
from .runner import run_workload
from .workload import EngineSetup, Workload, min_pages


def _set_request(wl: Workload, i: int, **changes) -> Workload:
    reqs = list(wl.requests)
    reqs[i] = replace(reqs[i], **changes)
    return replace(wl, requests=reqs)


def _set_abort(wl: Workload, k: int, **changes) -> Workload:
    aborts = list(wl.aborts)
    aborts[k] = replace(aborts[k], **changes)
    return replace(wl, aborts=aborts)


def _set_setup(wl: Workload, **changes) -> Workload:
    return replace(wl, setup=replace(wl.setup, **changes))


def candidates(wl: Workload, pool: PromptPool) -> Iterator[Workload]:
    """Simpler variants of `wl`, biggest simplifications first."""
    for i in reversed(range(len(wl.requests))):
        if len(wl.requests) > 1:
            yield wl.without_request(i)
    for k in reversed(range(len(wl.aborts))):
        yield replace(wl, aborts=wl.aborts[:k] + wl.aborts[k + 1 :])
    for k in reversed(range(len(wl.stray_aborts))):
        yield replace(wl, stray_aborts=wl.stray_aborts[:k] + wl.stray_aborts[k + 1 :])
    for k in reversed(range(len(wl.switch_loop_at))):
        yield replace(wl, switch_loop_at=wl.switch_loop_at[:k] + wl.switch_loop_at[k + 1 :])
    if wl.eos_token is not None:
        yield replace(wl, eos_token=None)
    # a simpler engine (the pool keeps its size in tokens)
    s = wl.setup
    plain = EngineSetup()
    for name in ("cpu_streams", "max_extend_tokens", "cache_type", "max_seq_len"):
        if getattr(s, name) != getattr(plain, name):
            yield _set_setup(wl, **{name: getattr(plain, name)})
    if s.page_size != 1:
        yield _set_setup(wl, page_size=1, num_pages=s.num_pages * s.page_size)
    if s.max_running_req > 1:
        yield _set_setup(wl, max_running_req=s.max_running_req - 1)
    if s.num_pages > min_pages(wl.requests, pool, s.page_size):
        yield _set_setup(wl, num_pages=min_pages(wl.requests, pool, s.page_size))
        yield _set_setup(wl, num_pages=s.num_pages - 1)
    # plainer requests and aborts
    for k, a in enumerate(wl.aborts):
        if a.duplicate:
            yield _set_abort(wl, k, duplicate=False)
        lowest = wl.requests[a.request].arrive if a.moment == "step" else 1
        if a.at > lowest:
            yield _set_abort(wl, k, at=lowest)
            yield _set_abort(wl, k, at=a.at - 1)
    for k, at in enumerate(wl.stray_aborts):
        if at > 0:
            yield replace(
                wl, stray_aborts=wl.stray_aborts[:k] + [at - 1] + wl.stray_aborts[k + 1 :]
            )
    for k, at in enumerate(wl.switch_loop_at):
        if at > 1 and at - 1 not in wl.switch_loop_at:
            yield replace(
                wl, switch_loop_at=wl.switch_loop_at[:k] + [at - 1] + wl.switch_loop_at[k + 1 :]
            )
    for i, r in enumerate(wl.requests):
        if r.arrive > 0:  # an arrival moves with its step aborts, so they stay after it
            for new in (0, r.arrive - 1):
                shift = new - r.arrive
                moved = _set_request(wl, i, arrive=new)
                moved.aborts = [
                    replace(a, at=a.at + shift) if a.request == i and a.moment == "step" else a
                    for a in moved.aborts
                ]
                yield moved
        for n in (1, r.max_tokens // 2, r.max_tokens - 1):
            if 1 <= n < r.max_tokens:
                yield _set_request(wl, i, max_tokens=n)
        if not r.is_greedy:
            yield _set_request(wl, i, temperature=0.0, top_k=-1, top_p=1.0)
        elif r.temperature != 0.0:
            yield _set_request(wl, i, temperature=0.0, top_k=-1)
        shorter = sorted(
            (len(p), j) for j, p in enumerate(pool.prompts) if len(p) < len(pool.prompts[r.prompt])
        )
        for _, j in shorter[:2] + shorter[-1:]:
            yield _set_request(wl, i, prompt=j)


def shrink(
    wl: Workload,
    kind: str,
    pool: PromptPool,
    model: Path,
    budget: int = 400,
    device: str = "cpu",
    llm_class=None,
) -> tuple[Workload, int]:
    """The smallest variant of `wl` found that still fails with `kind`, and the number of runs
    spent."""
    runs = 0
    improved = True
    while improved and runs < budget:
        improved = False
        for cand in candidates(wl, pool):
            if runs >= budget:
                break
            runs += 1
            failure = run_workload(cand, pool, model, device, llm_class).failure
            if failure is not None and failure.kind == kind:
                wl, improved = cand, True
                break
    return wl, runs
