"""Optimistic admission and retraction: admit on what requests are expected to use, and when a
decode step finds no free page, take a running request out and run it again later.

Reserve-all admission (the workbook's chapters 8 and 10) promises every request its whole life,
prompt + max_tokens, when it is admitted. It never runs out, but most requests end (EOS, a stop)
long before max_tokens, so most of what it promised sits unused and few requests run at once.

The estimate (`TokenRatio`): a request is planned to use `ratio * max_tokens` more tokens. The ratio
learns from the requests themselves: each that ends pulls it a tenth of the way towards the share
of its max_tokens it really used, and each retraction pushes it half the way to 1 (the plan was too
bold, and a retraction costs recomputation). It starts at `init_new_token_ratio` (0.7, as SGLang's
new_token_ratio) and stays in [0.1, 1].

Retraction, when a decode step needs more pages than are free or evictable: the victim is the
running request that has generated the fewest tokens, of those the longest prompt. It has the least
decoding work to redo, its prompt is usually still in the prefix cache, and the requests that have
run longest are left to finish (SGLang's retract_decode picks the same way). The victim:

* gives back its slot (deferred under overlap, rule 3) and its pages, its computed prefix going
  to the prefix cache as a finished request's does (resuming recomputes what was evicted since);
* is dropped from the batch in flight, if any (marked finished for that batch, rule 4: the token
  it is computing is computed again on resuming, with the same result for greedy and seeded
  sampling, whose seed is taken from the position);
* is requeued first in line with the tokens the CPU has received as its prompt and the rest of its
  max_tokens; its messages go on under the same uid, as if nothing happened.

The bound: a request retracted `max_retractions` times is readmitted with its whole life reserved
and is never chosen again. Every request admitted is either retractable or has its whole life
reserved beside the others' plans, so retracting every retractable request always leaves enough for
the rest: no deadlock, and no request loses its work more than `max_retractions` times. Requests
that ask for prompt logprobs are reserved whole as well (their first reply carries the prompt's
logprobs, which a resumed request could not give again).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, List

from minisgl.core import Batch, Req

from .cache import pages_for
from .mixed_handling import prefill_rows_only
from .planned import PlannedReq


class TokenRatio:
    """The share of max_tokens a request is expected to generate (see the module's docstring)."""

    def __init__(self, initial: float = 0.7, floor: float = 0.1, weight: float = 0.1) -> None:
        self.value, self.floor, self.weight = initial, floor, weight
        self.learn = True  # False holds the estimate still (tests that want retractions)

    def observe(self, used: int, asked: int) -> None:
        """A request ended having generated `used` of the `asked` (max_tokens) tokens."""
        if asked > 0 and self.learn:
            self.value += self.weight * (min(used / asked, 1.0) - self.value)
            self.value = max(self.floor, min(1.0, self.value))

    def retracted(self) -> None:
        if self.learn:
            self.value = min(1.0, self.value + (1.0 - self.value) / 2)


class Retraction:
    """A mixin of Scheduler (`self` is the scheduler): the plan each request is admitted on, and
    retraction when a decode step finds no page."""

    def _process_last_data(self, last_data) -> None:
        """Chapter 11's handling (the next class in the scheduler's bases); for a mixed step, with
        only its prefill rows' prompts handed to the prefix cache (mixed_handling.py)."""
        with prefill_rows_only(self, None if last_data is None else last_data[0].batch):
            super()._process_last_data(last_data)

    def _init_retraction(self) -> None:
        self.token_ratio = TokenRatio(initial=self.config.init_new_token_ratio)
        self.retractions: Dict[int, int] = {}  # uid -> times retracted (requests still alive)
        self.retracted_total = 0  # every retraction so far (benchmarks report it)
        self._prompt_lens: Dict[int, int] = {}  # uid -> its first prompt's length, once requeued

    # ------------------------------------------------------------------ the plan

    def _reserves_whole(self, uid: int, params) -> bool:
        return (
            not self.config.optimistic_admission
            or params.prompt_logprobs
            or self.retractions.get(uid, 0) >= self.config.max_retractions
        )

    def _planned_len(self, req: Req) -> int:
        """How far a running request is planned to grow (PrefillManager._reserved_pages)."""
        if self._reserves_whole(req.uid, req.sampling_params):
            return req.max_device_len
        planned = req.device_len + math.ceil(self.token_ratio.value * req.remain_len)
        return min(req.max_device_len, planned)

    def _plan_queue(self) -> None:
        """Set each waiting request's reserve_ratio for this step's admission (load.py)."""
        for p in self.prefill_manager.pending:
            whole = self._reserves_whole(p.uid, p.sampling_params)
            p.reserve_ratio = 1.0 if whole else self.token_ratio.value

    def _chunk_fits(self, pending: PlannedReq, token_budget: int) -> bool:
        """Whether the next piece of a prompt part-way through its prefill may run now: its pages
        fit beside what the running requests are planned to need (so a request reserved whole
        never finds its pages taken by a chunk)."""
        if not self.config.optimistic_admission:
            return True  # reserve-all: its pages were promised when it was admitted
        chunk = pending.chunked_req
        p = self.cache_manager.page_size
        end = min(len(pending.input_ids), chunk.cached_len + token_budget)
        need = pages_for(end, p) - pages_for(chunk.cached_len, p)
        return need + self.prefill_manager._reserved_pages() <= self.cache_manager.available_pages

    def _prompt_len(self, req: Req) -> int:
        """The length of the prompt the client sent (a resumed request's prompt is longer)."""
        return self._prompt_lens.get(req.uid, req.max_device_len - req.output_len)

    def _observe_end(self, req: Req) -> None:
        """A request ended (finished or aborted): learn from how much of max_tokens it used."""
        if req.is_chunk:
            return
        start = self._prompt_len(req)
        self.token_ratio.observe(len(req.input_ids) - start, req.max_device_len - start)
        self.retractions.pop(req.uid, None)
        self._prompt_lens.pop(req.uid, None)

    def _free_req_resources(self, req: Req) -> None:
        self._observe_end(req)
        super()._free_req_resources(req)

    # ------------------------------------------------------------------ retraction

    def _make_room(self, batch: Batch) -> None:
        """Retract requests of the decode `batch` until the pages it needs are free or evictable."""
        if not self.config.optimistic_admission:
            return
        p = self.cache_manager.page_size
        while True:
            need = sum(pages_for(r.device_len, p) - pages_for(r.cached_len, p) for r in batch.reqs)
            if need <= self.cache_manager.available_pages:
                return
            victim = self._choose_victim(batch.reqs)
            if victim is None:
                return  # nothing may be retracted: the step fails with "out of KV pages"
            self._retract(victim)
            batch.reqs.remove(victim)

    def _choose_victim(self, reqs: List[Req]) -> Req | None:
        """The running request to retract when a decode step finds no page, or None.

        The victim has generated the fewest tokens: it loses the least decoding work, and the
        requests that have run longest are left to finish. Of those equal, the longest prompt
        goes: it frees the most pages, and its prompt is the likeliest to still be in the prefix
        cache when it resumes. A request reserved whole (reserve-all, prompt logprobs, or
        retracted `max_retractions` times) is never chosen: that is what bounds retractions.

        Receives: `reqs`, the decode batch's requests (Req; `input_ids` holds every token the
            CPU has received, the prompt first, so a resumed request's prompt is longer than the
            client's).
        Returns: one of `reqs`, or None when none may be retracted (or `reqs` is empty).
        Leaves: nothing changed.
        Uses: `self._reserves_whole(uid, sampling_params)`; `self._prompt_len(req)`, the length
            of the prompt the client sent (generated = len(input_ids) - that).
        Checked: fewest generated first, resumed requests counted from the client's prompt; the
            longest prompt among equals; a request reserved whole never; None when all are.
        """
        candidates = [r for r in reqs if not self._reserves_whole(r.uid, r.sampling_params)]
        if not candidates:
            return None

        def generated(r: Req) -> int:
            return len(r.input_ids) - self._prompt_len(r)

        return min(candidates, key=lambda r: (generated(r), -self._prompt_len(r)))

    def _retract(self, req: Req) -> None:
        """Take running `req` out of the engine and requeue it to resume by recomputation.

        Its computed prefix (the `cached_len` tokens whose KV the device has written) goes to the
        prefix cache as a finished request's does, and every other page goes back: pages handed
        to the cache are the cache's from then on, and must not also be freed. Its slot goes back,
        deferred under overlap (`self._deferred_slots`), since a launched step may still write it.
        A batch in flight that holds it drops its result (`finished_reqs`). It is requeued first
        in line with every token the CPU has received as its prompt and the rest of its
        max_tokens, counted, so that the bound on retractions holds.

        Receives: `req`, a running request (in `self._live` and the decode manager).
        Returns: nothing.
        Leaves: `req` out of `self._live` and `self.decode_manager`, in `self.finished_reqs`; its
            slot freed or deferred; its prefix cached (`cache_manager.cache_req(req,
            finished=True)`); a PlannedReq(uid, input_ids received, params with max_tokens =
            max_device_len - len(input_ids) and no prompt logprobs, retractions=count) first in
            `self.prefill_manager.pending`; `self.retractions[uid]` = count, one more than
            before; `self.retracted_total` one higher; `self._prompt_lens[uid]` the client's
            prompt length (kept from the first retraction); `self.token_ratio.retracted()`
            called; a "retract" event (uid, count, tokens).
        Uses: `self._prompt_len` (above), `decode_manager.remove_req` (ch07), `table_manager.free`
            (ch08), `cache_manager.cache_req` (ch09), `dataclasses.replace`, `self.events.emit`.
        Checked: greedy and seeded outputs equal an unpressured run's, overlap on and off; after
            every retraction: not running, dropped from the batch in flight, queued once and
            first, resumed from the tokens received with the rest of max_tokens, counted, no page
            freed twice, the computed prefix cached and nothing past it; at the end every page
            and slot back, nothing left behind.
        """
        uid = req.uid
        self._prompt_lens.setdefault(uid, self._prompt_len(req))
        count = self.retractions.get(uid, 0) + 1
        self.retractions[uid] = count
        self.retracted_total += 1
        self.token_ratio.retracted()
        self._live.pop(uid, None)
        self.decode_manager.remove_req(req)
        self.finished_reqs.add(req)  # rule 4: a batch in flight that holds it drops its result
        if self._defer_slot_free:
            self._deferred_slots.append((req.table_idx, uid))
        else:
            self.table_manager.free(req.table_idx, uid)
        self.cache_manager.cache_req(req, finished=True)
        prompt = req.input_ids.clone()  # every token the CPU has received
        params = replace(
            req.sampling_params,
            max_tokens=req.max_device_len - len(prompt),
            prompt_logprobs=False,
        )
        resumed = PlannedReq(uid, prompt, params, retractions=count)
        self.prefill_manager.pending.insert(0, resumed)
        self.events.emit("retract", uid=uid, count=count, tokens=len(prompt))

    def _forget_ended(self) -> None:
        """Drop the bookkeeping of requests that ended without being handled here (aborted while
        queued, failed steps)."""
        if not self._prompt_lens and not self.retractions:
            return
        alive = set(self._live) | {p.uid for p in self.prefill_manager.pending}
        for book in (self._prompt_lens, self.retractions):
            for uid in [u for u in book if u not in alive]:
                del book[uid]
