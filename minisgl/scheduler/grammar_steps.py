"""Structured output in the scheduler: each constrained request's matcher, from admission to its
end, and each step's bitmask, filled between the forward and the sampling.

A grammar's mask for step N+1 depends on the token sampled at step N. Under overlap the CPU does
not have that token when step N+1 is launched, but the forward does not need the mask, only the
sampling does. So a batch with a constrained request is launched in two parts
(minisgl/engine/split_step.py), and the order of a turn becomes:

    launch step N+1's forward -> handle step N (each matcher accepts its token)
                              -> fill step N+1's bitmask -> launch step N+1's sampling

The grammar's CPU work runs while the device computes the forward, like the rest of the CPU work
of chapter 11. The normal loop handles step N before it launches step N+1, so its matchers are
already up to date: it fills the mask and launches the sampling before handling the step.

Matchers are per-request state, kept by uid: created when the request is taken in (its grammar
was compiled at the door: `admit` refuses one that does not compile, with the library's error),
fed the tokens the CPU receives (the rules of chapter 11 decide which: no chunk, nothing for a
request finished or aborted after the batch was launched), and dropped at the first handling
after the request ends, however it ended (EOS, max_tokens, stop, abort, a failed step).

A token a matcher refuses can only come from a mask filled from a stale matcher; it is logged as
a `grammar_reject` event and the matcher, in error from then on, allows only EOS.
"""

from __future__ import annotations

import time
from typing import Any, Dict

import torch

from minisgl.engine.split_step import PendingSample, launch_forward, launch_sample
from minisgl.message import UserMsg
from minisgl.structured.grammars import GrammarBook

from .intake import RequestRefused


class GrammarSteps:
    """A mixin of Scheduler, first in its bases (`self` is the scheduler)."""

    _pending_sample: PendingSample | None = None

    def _init_grammars(self) -> None:
        self.grammars = GrammarBook(self.stops.tokenizer, self.vocab_size, self.eos_token_ids)
        self._matchers: Dict[int, Any] = {}  # uid -> llguidance matcher of a constrained request

    # ---------------------------------------------------------------- admission

    def admit(self, input_ids, params):
        params = super().admit(input_ids, params)
        reason = self.grammars.refusal(params.constraint)
        if reason is not None:
            raise RequestRefused(reason)
        return params

    def _process_one_msg(self, msg) -> None:
        super()._process_one_msg(msg)
        if isinstance(msg, UserMsg) and self.prefill_manager.get(msg.uid) is not None:
            constraint = self.prefill_manager.get(msg.uid).sampling_params.constraint
            if constraint is not None:
                self._matchers[msg.uid] = self.grammars.matcher(constraint)

    # ---------------------------------------------------------------- launch

    def _needs_mask(self, fi) -> bool:
        return bool(self._matchers) and any(
            not r.is_chunk and r.uid in self._matchers for r in fi.batch.reqs
        )

    def _launch_forward_only(self, fi):
        """Launch `fi`'s forward; its sampling waits in `_pending_sample` for the next handling."""
        pending = launch_forward(self.engine, fi)
        self._pending_sample = pending
        return pending.out

    # ---------------------------------------------------------------- handling

    def _process_last_data(self, last_data) -> None:
        pending, self._pending_sample = self._pending_sample, None
        if pending is not None and last_data is not None and last_data[0] is pending.fi:
            self._sample_pending(pending)  # the normal loop: its matchers are up to date
            pending = None
        if last_data is not None:
            self._accept_tokens(last_data)
        super()._process_last_data(last_data)
        if self._matchers:
            self._drop_ended_matchers()
        if pending is not None:  # the overlap loop: step N handled, now step N+1's mask
            self._sample_pending(pending)

    def _accept_tokens(self, last_data) -> None:
        if not self._matchers:
            return
        fi, output = last_data
        output.copy_done.synchronize()
        tokens = output.next_tokens_cpu.tolist()
        for req, token in zip(fi.batch.reqs, tokens):
            if req.is_chunk or req in self.finished_reqs:
                continue  # a chunk samples nothing; a finished request gets nothing (rule 2/4)
            matcher = self._matchers.get(req.uid)
            if matcher is not None and not matcher.consume_token(token):
                self.events.emit(
                    "grammar_reject", uid=req.uid, token=token, error=matcher.get_error()
                )

    def _drop_ended_matchers(self) -> None:
        ended = [
            uid
            for uid in self._matchers
            if uid not in self._live and self.prefill_manager.get(uid) is None
        ]
        for uid in ended:
            del self._matchers[uid]

    def _sample_pending(self, pending: PendingSample) -> None:
        """Fill the bitmask of `pending`'s constrained rows and launch its sampling."""
        batch = pending.fi.batch
        rows, matchers = [], []
        for i, req in enumerate(batch.reqs):
            if req.is_chunk or req in self.finished_reqs:
                continue  # its sample is dropped: any token will do
            matcher = self._matchers.get(req.uid)
            if matcher is not None:
                rows.append(i)
                matchers.append(matcher)
        start = time.perf_counter()
        bitmask = self.grammars.bitmask(matchers)
        self.events.emit(
            "grammar_mask", step=batch.step, rows=len(rows), seconds=time.perf_counter() - start
        )
        try:
            launch_sample(self.engine, pending, torch.tensor(rows, dtype=torch.int64), bitmask)
        except Exception as e:  # noqa: BLE001 - as in _forward: only this batch's requests pay
            self._fail_batch(batch, e)
            pending.out.copy_done.record(self.engine.stream)
