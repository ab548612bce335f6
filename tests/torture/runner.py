"""Drives one workload through the offline engine, step by step, and records what it saw.

Requests arrive and aborts are sent between loop iterations (`llm.add_request`, `llm.abort`) or from
event-log callbacks at the moment a batch is launched or handled, or a request's last message is
sent. The slot checks run on every event, the page and lock checks after every iteration, the idle
checks at the end; the outcome of every request is judged by `outcome.check_outcome`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

from minisgl import SamplingParams
from minisgl.env import ENV
from minisgl.message import AbortBackendMsg, DetokenizeMsg

from .invariants import SlotWatch, Violation, check_idle, check_running
from .prompts import PromptPool
from .workload import Workload

STRAY_UID = 10**9  # uids the LLM never issues (it counts from 0)
MAX_ITERATIONS = 3000


@dataclass
class FrontendAbort:
    seq: int  # messages with a smaller event number had reached the client
    had_finished: bool  # the request had already finished: llm.abort was a no-op


@dataclass
class Transcript:
    """What happened, per request uid, numbered by event order."""

    uids: Dict[int, int] = field(default_factory=dict)  # request index -> uid
    messages: Dict[int, List[Tuple[int, DetokenizeMsg]]] = field(default_factory=dict)
    frontend_aborts: Dict[int, FrontendAbort] = field(default_factory=dict)
    # uid -> seq of its first abort event
    scheduler_aborts: Dict[int, int] = field(default_factory=dict)
    abort_states: Counter = field(default_factory=Counter)  # "queued", "prefilling", "running", ...
    rejects: List[str] = field(default_factory=list)
    iterations: int = 0
    launches: int = 0
    retractions: int = 0


@dataclass
class RunResult:
    workload: Workload
    transcript: Transcript
    failure: Violation | None

    @property
    def aborts(self) -> int:
        return sum(self.transcript.abort_states.values())


def _params(spec) -> SamplingParams:
    return SamplingParams(
        temperature=spec.temperature,
        top_k=spec.top_k,
        top_p=spec.top_p,
        max_tokens=spec.max_tokens,
        ignore_eos=spec.ignore_eos,
    )


class Driver:
    def __init__(
        self, wl: Workload, pool: PromptPool, model: Path, device: str = "cpu", llm_class=None
    ) -> None:
        from helpers import build_llm

        s = wl.setup
        self.wl, self.pool = wl, pool
        options = dict(
            device=device,
            cache_type=s.cache_type,
            page_size=s.page_size,
            num_page_override=s.num_pages,
            max_extend_tokens=s.max_extend_tokens,
            max_running_req=s.max_running_req,
            cpu_streams=s.cpu_streams,
            max_seq_len_override=s.max_seq_len,
            optimistic_admission=s.optimistic_admission,
            init_new_token_ratio=s.init_new_token_ratio,
            mixed_batches=s.mixed_batches,
        )
        if (
            llm_class is not None
        ):  # a subclass of LLM, e.g. a known-wrong variant the torture must catch
            options["llm_class"] = llm_class
        self.llm = build_llm(model, **options)
        if wl.eos_token is not None:
            self.llm.eos_token_ids = {wl.eos_token}
        self.llm.token_ratio.learn = s.learn_ratio
        self.t = Transcript()
        self.slots = SlotWatch(s.max_running_req)
        self.seq = 0  # number of the event being dispatched (or the next one, between steps)
        self.batch_counts: Counter = Counter()  # (moment, uid) -> batches launched / handled so far
        self.llm.events.subscribe(self._on_event)

    @property
    def eos(self) -> int | None:
        # the torture's checks assume one end id (the bundled model has one)
        ids = self.llm.eos_token_ids
        assert len(ids) <= 1, (
            f"the torture test expects a model with at most one EOS id, got {sorted(ids)}"
        )
        return next(iter(ids), None)

    # ------------------------------------------------------------------ aborts

    def abort(self, i: int, duplicate: bool) -> None:
        uid = self.t.uids[i]
        if uid in self.t.frontend_aborts:
            return
        result = self.llm.results[uid]
        self.t.frontend_aborts[uid] = FrontendAbort(self.seq, had_finished=result.finished)
        self.llm.abort(uid)
        if duplicate:  # the scheduler must shrug off a second abort of the same uid
            self.llm.io.put(AbortBackendMsg(uid=uid))

    def _triggered(self, moment: str, uid: int) -> None:
        idx = next((i for i, u in self.t.uids.items() if u == uid), None)
        if idx is None:
            return
        for a in self.wl.aborts:
            if (
                a.request == idx
                and a.moment == moment
                and (moment == "finish" or a.at == self.batch_counts[moment, uid])
            ):
                self.abort(idx, a.duplicate)

    def _on_event(self, ev) -> None:
        self.seq += 1
        seq = self.seq
        self.slots.on_event(ev)
        if ev.kind in ("launch", "handle"):
            if ev.kind == "launch":
                self.t.launches += 1
            for uid in ev["uids"]:
                self.batch_counts[ev.kind, uid] += 1
                self._triggered(ev.kind, uid)
        elif ev.kind == "send":
            for m in ev["msgs"]:
                self._on_message(seq, m)
            for m in ev["msgs"]:
                if m.finished:
                    self._triggered("finish", m.uid)
        elif ev.kind == "abort":
            self.t.abort_states[ev["state"]] += 1
            self.t.scheduler_aborts.setdefault(ev["uid"], seq)
        elif ev.kind == "retract":
            self.t.retractions += 1
        elif ev.kind == "reject":
            self.t.rejects.append(f"uid {ev['uid']}: {ev['reason']}")

    def _on_message(self, seq: int, m: DetokenizeMsg) -> None:
        got = self.t.messages.setdefault(m.uid, [])
        if got and got[-1][1].finished:
            raise Violation(
                "message-after-finished",
                f"uid {m.uid} got token {m.next_token} after its finished message",
            )
        if m.uid in self.t.scheduler_aborts:
            raise Violation(
                "message-after-abort",
                f"uid {m.uid} got token {m.next_token} after the scheduler aborted it",
            )
        got.append((seq, m))

    # ------------------------------------------------------------------ the loop

    def _before_iteration(self, it: int) -> None:
        llm, wl = self.llm, self.wl
        self.seq += 1  # actions between steps come after every event so far
        for i, r in enumerate(wl.requests):
            if r.arrive == it:
                self.t.uids[i] = llm.add_request(self.pool.prompts[r.prompt], _params(r))
        for a in wl.aborts:
            if a.moment == "step" and a.at == it and a.request in self.t.uids:
                self.abort(a.request, a.duplicate)
        for k, at in enumerate(wl.stray_aborts):
            if at == it:
                llm.io.put(AbortBackendMsg(uid=STRAY_UID + k))
        if it in wl.switch_loop_at:
            ENV.DISABLE_OVERLAP_SCHEDULING.value = not ENV.DISABLE_OVERLAP_SCHEDULING.value

    def run(self) -> RunResult:
        llm, wl = self.llm, self.wl
        saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not wl.setup.overlap
        last_arrival = max((r.arrive for r in wl.requests), default=0)
        failure = None
        try:
            try:
                llm.abort(STRAY_UID)
            except ValueError:
                pass
            else:
                raise Violation(
                    "abort-unknown", f"llm.abort({STRAY_UID}) of a uid never issued did not raise"
                )
            it = 0
            while True:
                self._before_iteration(it)
                if it >= last_arrival and it >= max(wl.stray_aborts, default=0) and not llm.busy:
                    break
                if it >= MAX_ITERATIONS:
                    raise Violation(
                        "stuck",
                        f"still busy after {it} iterations "
                        f"({len(llm.prefill_manager.pending)} queued)",
                    )
                llm.step()
                it += 1
                self.t.iterations = it
                check_running(llm, self.slots)
            check_idle(llm, self.slots)
            from .outcome import check_outcome

            check_outcome(self)
        except Violation as v:
            failure = v
        except Exception as e:  # the engine itself broke
            import traceback

            tb = traceback.extract_tb(e.__traceback__)[-1]
            failure = Violation(
                f"crash:{type(e).__name__}", f"{e} (at {Path(tb.filename).name}:{tb.lineno})"
            )
        finally:
            ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        return RunResult(wl, self.t, failure)


def run_workload(
    wl: Workload, pool: PromptPool, model: Path, device: str = "cpu", llm_class=None
) -> RunResult:
    try:
        driver = Driver(wl, pool, model, device, llm_class)
    except Exception as e:
        return RunResult(
            wl, Transcript(), Violation(f"crash:{type(e).__name__}", f"building the LLM: {e}")
        )
    return driver.run()
