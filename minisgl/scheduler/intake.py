"""A request's way in: every request, offline (`LLM.generate`, `LLM.add_request`) or from the
server's tokenizer worker (a UserMsg), is checked and given its model's defaults here, once.

`admit` is that one place: the sampling settings are validated (a message may come from anywhere:
nothing unchecked may reach a kernel), the fields the request left unset take the model's
generation_config.json defaults (`ModelLimits.sampling_defaults`), and the request is held to the
model's limits (vocabulary, context length) and the KV pool's size. The offline `LLM` calls it at
its door, so a bad prompt fails the call that brought it; the server's requests meet it when their
message arrives, and a refusal is a reply with the reason.
"""

from __future__ import annotations

from typing import List

import torch

from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, BackendMsg, DetokenizeMsg, UserMsg

from .cache import pages_for


class RequestRefused(ValueError):
    """A request that can never run here; the message says why."""


class Intake:
    """The Scheduler's messages in and out, and the admission of new requests (a mixin of
    Scheduler: `self` is the scheduler)."""

    def receive_msg(self, blocking: bool = False) -> List[BackendMsg]:
        return self.io.receive(blocking)

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        if reply:
            self.events.emit("send", msgs=list(reply))
            self.io.send(reply)

    def _reject(self, uid: int, reason: str) -> None:
        self.events.emit("reject", uid=uid, reason=reason)
        self.send_result([DetokenizeMsg(uid=uid, next_token=-1, finished=True, error=reason)])

    def admit(self, input_ids: torch.Tensor, params: SamplingParams) -> SamplingParams:
        """The request's sampling settings with the model's defaults filled in, or RequestRefused
        naming why it can never run here (nothing is queued either way)."""
        if not isinstance(params, SamplingParams):
            raise RequestRefused(f"sampling_params must be SamplingParams, got {params!r}")
        try:
            params.validate()  # fields may have been assigned since the constructor checked them
            if self.limits.sampling_defaults:
                params = params.with_defaults(self.limits.sampling_defaults)
        except (TypeError, ValueError) as e:
            raise RequestRefused(f"bad sampling parameters: {e}") from None
        reason = self.stops.refusal(params) or self.validate_request(input_ids, params.max_tokens)
        bad_stop = [i for i in params.stop_token_ids if i >= self.vocab_size]
        if reason is None and bad_stop:
            reason = f"stop token id {bad_stop[0]} is outside the vocabulary [0, {self.vocab_size})"
        if reason is not None:
            raise RequestRefused(reason)
        return params

    def validate_request(self, input_ids: torch.Tensor, max_tokens: int) -> str | None:
        """Why a request can never run here, or None if it can."""
        n = len(input_ids)
        if n == 0:
            return "the prompt is empty"
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            return f"token id {bad} is outside the vocabulary [0, {self.vocab_size})"
        limit = self.limits.context_len
        # max_tokens 0 (prompt scoring) still samples one token, written after the prompt
        max_tokens = max(max_tokens, 1)
        if n + max_tokens > limit:
            return (
                f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds the context "
                f"length {limit}"
            )
        need = pages_for(n + max_tokens, self.engine.page_size)
        if need > self.engine.num_pages:
            return (
                f"the request needs {need} KV pages but the pool has only {self.engine.num_pages}"
            )
        return None

    def _process_one_msg(self, msg: BackendMsg) -> None:
        if isinstance(msg, UserMsg):
            try:
                params = self.admit(msg.input_ids, msg.sampling_params)
            except RequestRefused as e:
                self._reject(msg.uid, str(e))
            else:
                self.prefill_manager.add_one_req(msg.uid, msg.input_ids, params)
        elif isinstance(msg, AbortBackendMsg):
            self._abort(msg.uid)
        else:
            raise TypeError(f"unknown message {msg!r}")
