"""A request's sampling settings as the engine's SamplingParams, and the OpenAI API's `code` for a
refusal: the step from the API's shapes (openai_api.py) to the engine's, and back for errors."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

from minisgl.core import MAX_LOGPROBS, SamplingParams

from .openai_api import ChatRequest, ErrorInfo, _Request


def sampling_params(req: _Request, max_tokens: int) -> SamplingParams:
    """The request's sampling settings, or an ErrorInfo (400) naming the one that is wrong.

    Only the fields the client sent count as set (`fields_set`); the others hold the API's
    defaults until the scheduler's intake gives them the model's generation_config.json defaults
    where it has some, as the offline LLM's requests get them."""
    # null counts as not sent: the field keeps its default. A request field of a SamplingParams
    # field's name is that field (max_tokens also comes as max_completion_tokens).
    sent = {name for name in req.model_fields_set if getattr(req, name) is not None}
    if "max_completion_tokens" in sent:
        sent.add("max_tokens")
    given = sorted(sent & {f.name for f in dataclasses.fields(SamplingParams)})
    scoring = logprob_fields(req, max_tokens)
    if max_tokens == 0 and not scoring.get("prompt_logprobs"):
        echo = (
            ""
            if isinstance(req, ChatRequest)
            else " (0 only with echo and logprobs: the prompt is scored)"
        )
        raise ErrorInfo(400, f"max_tokens must be >= 1{echo}", param="max_tokens")
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_k=-1 if req.top_k is None else req.top_k,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_tokens=max_tokens,
            ignore_eos=bool(req.ignore_eos),
            stop=req.stop or [],
            stop_token_ids=req.stop_token_ids or [],
            seed=req.seed,
            **scoring,
            fields_set=given,
        )
    except (TypeError, ValueError) as e:
        raise ErrorInfo(400, str(e), param=str(e).split()[0]) from None


CONTEXT_TOO_LONG = ("exceeds the context length", "KV pages but the pool has only")


def error_code(message: str) -> str | None:
    """The OpenAI API's `code` for a refusal, from the scheduler's words (intake.py): a prompt and
    max_tokens longer than the model's context, or than this server's KV pool, is
    "context_length_exceeded", as the OpenAI API names it and its clients test it."""
    return "context_length_exceeded" if any(c in message for c in CONTEXT_TOO_LONG) else None


def logprob_fields(req: _Request, max_tokens: int) -> Dict[str, Any]:
    """SamplingParams' logprobs and prompt_logprobs for a request: a completion's `logprobs: k`
    (with `echo`, the prompt's too; `echo` and `logprobs` with `max_tokens: 0` score the prompt
    alone, as lm-eval's loglikelihood asks), a chat's `logprobs: true` with `top_logprobs: k`."""
    if isinstance(req, ChatRequest):
        k = req.top_logprobs
        if k is not None and not req.logprobs:
            raise ErrorInfo(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if k is not None and not 0 <= k <= MAX_LOGPROBS:
            raise ErrorInfo(
                400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {k}", param="top_logprobs"
            )
        return {"logprobs": (req.top_logprobs or 0) if req.logprobs else None}
    echo = bool(getattr(req, "echo", False))
    # (`echo` with `max_tokens: 0` and no logprobs would score the prompt for nobody: refused)
    return {"logprobs": req.logprobs, "prompt_logprobs": echo and req.logprobs is not None}
