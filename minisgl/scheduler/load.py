"""The waiting queue and the running set of a scheduler under load: the chapters' managers with the
two decisions production engines add on top (chapter 23).

* `LoadPrefillManager` offers the queue in the policy's order (policy.py) and admits on the plan of
  retract.py: a request's whole life under reserve-all admission, an estimate under optimistic
  admission. The rules of chapter 10's `schedule_next_batch` and `try_add_one` are unchanged: they
  take the queue as given and plan for `PendingReq.total_len`, which is the plan's here.
* `RetractingDecodeManager` makes room for a decode batch, retracting requests when the pages it
  needs are not there (retract.py).

Mixed batches (`mixed_batches`): a prefill step carries the running requests' decode tokens too,
under the one token budget (each decode takes one token of it, the prompt chunks the rest), so a
long prompt being chunked no longer stops every decoder for its steps. A decode is a prefill of one
token over a cached prefix, which the prefill path of both attention backends already computes: the
batch runs as a prefill (no CUDA graph; graphs stay for pure decode steps). Requests that asked for
prompt logprobs keep mixing off while they run (a prefill step scores the prompts of its requests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.core import Batch, SamplingParams

from .cache import pages_for
from .decode import DecodeManager
from .planned import PlannedReq
from .policy import order_queue
from .prefill import PrefillManager

if TYPE_CHECKING:
    from .retract import Retraction


class LoadPrefillManager(PrefillManager):
    def __init__(self, *args, load: "Retraction") -> None:
        super().__init__(*args)
        self.load = load

    def add_one_req(self, uid: int, input_ids: torch.Tensor, params: SamplingParams) -> None:
        if params.prompt_logprobs:  # its prompt needs logits everywhere: a cached prefix has none
            self.cache_manager.never_match(input_ids)
        self.pending.append(PlannedReq(uid, input_ids, params))

    def _reserved_pages(self) -> int:
        """Pages the running requests are planned to still ask for."""
        p = self.cache_manager.page_size
        return sum(
            pages_for(self.load._planned_len(r), p) - pages_for(r.cached_len, p)
            for r in self.decode_manager.running.values()
        )

    def schedule_next_batch(self, token_budget: int) -> Batch | None:
        """Chapter 10's prefill batch, built from the queue in the policy's order on this step's
        plan (the queue itself keeps its arrival order); with mixed batches, the running requests'
        decode tokens in it too, under the same budget."""
        decodes = None
        if self.load.config.mixed_batches and self._mixable():
            decodes = self.decode_manager.schedule_next_batch()  # may retract (optimistic)
            if decodes is not None:
                token_budget -= len(decodes.reqs)
                if token_budget < 1 or not self.pending:
                    return None  # a decode step: the budget is all decoders (or none wait now)
        prefill = self._prefill_batch(token_budget)
        if prefill is None or decodes is None:
            return prefill
        reqs = prefill.reqs + decodes.reqs
        return Batch(reqs=reqs, phase="prefill", mixed_decodes=len(decodes.reqs))

    def _mixable(self) -> bool:
        return self.decode_manager.runnable and not any(
            r.sampling_params.prompt_logprobs for r in self.decode_manager.running.values()
        )

    def _prefill_batch(self, token_budget: int) -> Batch | None:
        load = self.load
        load._forget_ended()
        load._plan_queue()
        queue = self.pending
        config = load.config
        ordered = order_queue(
            queue, self.cache_manager, config.schedule_policy, config.lpm_max_queue
        )
        first = ordered[0]
        if first.chunked_req is not None and not load._chunk_fits(first, token_budget):
            return None  # its next piece waits for pages; decoding goes on meanwhile
        self.pending = ordered
        try:
            return super().schedule_next_batch(token_budget)
        finally:
            left = set(self.pending)
            self.pending = [p for p in queue if p in left]


class RetractingDecodeManager(DecodeManager):
    def __init__(self, load: "Retraction") -> None:
        super().__init__()
        self.load = load

    def schedule_next_batch(self) -> Batch | None:
        """Chapter 7's decode batch, less the requests retracted to make room for it."""
        batch = super().schedule_next_batch()
        if batch is not None:
            self.load._make_room(batch)
        return batch if batch is not None and batch.reqs else None
