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
fed the tokens its request generates (a chunk's junk sample is not one), and dropped at the
first handling after the request ends, however it ended (EOS, max_tokens, stop, abort, a failed
step).

A token a matcher refuses can only come from a mask filled from a stale matcher; it is logged as
a `grammar_reject` event and the matcher, in error from then on, allows only EOS.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict

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
        self._handle_step(last_data, super()._process_last_data)

    def _handle_step(self, last_data, handle: Callable) -> None:
        """Handle step N, then fill step N+1's mask and launch its sampling.

        The order gives every mask its matchers' latest token. Under overlap, step N+1's forward is
        already launched, its sampling waiting in `self._pending_sample`. Its mask depends on step
        N's tokens, which reach the matchers only when step N is handled: so step N is handled
        first, then step N+1's mask is filled and its sampling launched, while the device still
        computes the forward. The normal loop launched step N itself, forward only, just before this
        handling: that step's sampling must be launched first (its tokens are what the handling
        waits for), and its matchers are up to date already (step N-1 was handled in the previous
        turn).

        Receives: `last_data`, the step to handle, (ForwardInput, ForwardOutput) or None (nothing
            to handle); `handle`, the handling of chapter 11 (and the extras': stops, logprobs),
            which waits for the step's tokens, sends them and ends finished requests;
            `self._pending_sample`, a PendingSample (a forward launched without its sampling) or
            None.
        Returns: nothing.
        Leaves: `self._pending_sample` None; its sampling launched, with its mask filled after the
            matchers took step N's tokens (overlap), or before step N is handled (the step being
            handled is the pending one: the normal loop); step N handled with its matchers
            (`self._handle_with_matchers`).
        Uses: `self._sample_pending(pending)` (fills the mask from the matchers as they are and
            launches the sampling), `self._handle_with_matchers(last_data, handle)`.
        Checked: constrained outputs parse and validate under overlap with deferred CPU streams
            and with the normal loop, and the two loops give the same tokens; no matcher refuses a
            token; every step is sampled exactly once.
        """
        pending, self._pending_sample = self._pending_sample, None
        if pending is not None and last_data is not None and last_data[0] is pending.fi:
            self._sample_pending(pending)  # the normal loop: its matchers are up to date
            pending = None
        self._handle_with_matchers(last_data, handle)
        if pending is not None:  # the overlap loop: step N handled, now step N+1's mask
            self._sample_pending(pending)

    def _handle_with_matchers(self, last_data, handle: Callable) -> None:
        """Handle a step with the matchers: each takes its token, ended requests lose theirs.

        Each constrained request's matcher takes the token the request generated, then `handle`
        runs, then the matchers of requests that have ended are dropped. A matcher must see exactly
        the tokens its request generates, in order: the token is on the host only once the step's
        `copy_done` has been waited for, a chunk's sample is junk (a part of the prompt generates
        nothing, and its sample was drawn without a mask), and a request in `self.finished_reqs`
        gets nothing from the step (the handling drops its token: chapter 11's rules 2 and 4; a
        request retracted meanwhile keeps its uid and matcher, and computes that token again when
        it resumes). A matcher lives as long as its request: once `handle` has run, the matchers
        of requests that are neither launched and running (`self._live`) nor waiting in the
        prefill queue are dropped, whatever ended them (EOS, max_tokens, a stop string, an abort, a
        failed step). A token the matcher refuses is recorded, not raised: a `grammar_reject` event
        naming the uid, the token and the matcher's error.

        Receives: `last_data`, (ForwardInput, ForwardOutput) or None; `handle`, the base handling
            (call it with `last_data`, None included); `self._matchers`, uid -> llguidance matcher
            (`consume_token(token) -> bool`, `get_error() -> str`).
        Returns: nothing.
        Leaves: each matcher advanced by its request's token; the matchers of ended requests gone
            from `self._matchers`; `last_data` handled by `handle`.
        Uses: `copy_done.synchronize`, `next_tokens_cpu` (ch06); `is_chunk` (ch10); `_live`,
            `finished_reqs` (ch11); `prefill_manager.get` (ch07); `events.emit` (ch04).
        Checked: every output parses and validates, next to chunked prefills and free requests,
            under overlap and not; no grammar_reject in a correct run; a refused token is recorded;
            a request in finished_reqs feeds its matcher nothing; no matcher left once every
            request has ended, after an abort too; a queued request keeps its matcher until it
            runs.
        """
        if last_data is not None and self._matchers:
            fi, output = last_data
            output.copy_done.synchronize()
            for req, token in zip(fi.batch.reqs, output.next_tokens_cpu.tolist()):
                if req.is_chunk:
                    continue  # a chunk's sample is junk, drawn without a mask
                if req in self.finished_reqs:
                    # The handling drops this token (rules 2 and 4), so the matcher must not take
                    # it: a request retracted while this step was in flight keeps its uid and
                    # matcher, and recomputes the token when it resumes (retract.py).
                    continue
                matcher = self._matchers.get(req.uid)
                if matcher is not None and not matcher.consume_token(token):
                    self.events.emit(
                        "grammar_reject", uid=req.uid, token=token, error=matcher.get_error()
                    )
        handle(last_data)
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
