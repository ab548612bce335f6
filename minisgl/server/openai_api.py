"""The OpenAI API's shapes: what requests may hold, and the JSON and server-sent events answering
them (https://platform.openai.com/docs/api-reference). Pure functions and pydantic models; the HTTP
side is in app.py.

Extensions, as other OpenAI-compatible servers have them: `top_k`, `ignore_eos` and
`stop_token_ids` (sampling), and `return_token_ids` (each choice, and each streamed chunk, also
carries the token ids it adds). `stop`, `seed`, `logprobs` (a completion's k, a chat's true with
`top_logprobs`) and a completion's `echo` are honoured (SamplingParams, minisgl/core.py).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal

from pydantic import BaseModel, ConfigDict

from minisgl.core import MAX_LOGPROBS, SamplingParams


class ErrorInfo(Exception):
    """A request the server answers with an OpenAI-style error body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> Dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Request(BaseModel):
    model_config = ConfigDict(
        extra="ignore"
    )  # fields we do not know are ignored, as OpenAI's clients expect

    model: str
    temperature: float = 1.0  # the OpenAI API's default (the offline LLM's is greedy)
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    stream: bool = False
    stream_options: Dict[str, Any] | None = None
    stop: str | List[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    stop_token_ids: List[int] | None = None  # an extension, as vLLM and SGLang have it
    return_token_ids: bool = False

    def unsupported(self) -> List[str]:
        """Settings this server cannot honour: refused, never silently ignored."""
        bad = []
        if self.n != 1:
            bad.append("n")
        if self.presence_penalty:
            bad.append("presence_penalty")
        if self.frequency_penalty:
            bad.append("frequency_penalty")
        return bad


class CompletionRequest(_Request):
    prompt: str | List[int]
    max_tokens: int | None = 16  # the OpenAI API's default for completions
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> List[str]:
        bad = super().unsupported()
        bad += [name for name in ("suffix",) if getattr(self, name)]
        if self.best_of not in (None, 1):
            bad.append("best_of")
        return bad


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | List[ContentPart]

    def as_dict(self) -> Dict[str, str]:
        text = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )
        return {"role": self.role, "content": text}


class ChatRequest(_Request):
    messages: List[ChatMessage]
    max_tokens: int | None = None  # None: as long as the context allows
    max_completion_tokens: int | None = None  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None  # alternatives per token; needs logprobs, as OpenAI says

    def unsupported(self) -> List[str]:
        return super().unsupported()


def sampling_params(req: _Request, max_tokens: int) -> SamplingParams:
    """The request's sampling settings, or an ErrorInfo (400) naming the one that is wrong.

    Only the fields the client sent count as set (`fields_set`); the others hold the API's
    defaults until the scheduler's intake gives them the model's generation_config.json defaults
    where it has some, as the offline LLM's requests get them."""
    sent = req.model_fields_set
    given = [name for name in ("temperature", "top_k", "top_p", "ignore_eos") if name in sent]
    if {"max_tokens", "max_completion_tokens"} & sent and max_tokens_given(req):
        given.append("max_tokens")
    scoring = logprob_fields(req, max_tokens)
    if max_tokens == 0 and not scoring.get("prompt_logprobs"):
        raise ErrorInfo(
            400,
            "max_tokens must be >= 1 (0 only with echo: the prompt is scored, nothing generated)",
            param="max_tokens",
        )
    try:
        return SamplingParams(
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            stop=req.stop or [],
            stop_token_ids=req.stop_token_ids or [],
            seed=req.seed,
            **scoring,
            fields_set=given,
        )
    except (TypeError, ValueError) as e:
        raise ErrorInfo(400, str(e), param=str(e).split()[0]) from None


def logprob_fields(req: _Request, max_tokens: int) -> Dict[str, Any]:
    """SamplingParams' logprobs and prompt_logprobs for a request: a completion's `logprobs: k`
    (with `echo`, the prompt's too; `echo` with `max_tokens: 0` scores the prompt alone, as
    lm-eval's loglikelihood asks), a chat's `logprobs: true` with `top_logprobs: k`."""
    if isinstance(req, ChatRequest):
        k = req.top_logprobs
        if k is not None and not req.logprobs:
            raise ErrorInfo(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if k is not None and not 0 <= k <= MAX_LOGPROBS:
            raise ErrorInfo(
                400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {k}", param="top_logprobs"
            )
        return {"logprobs": (req.top_logprobs or 0) if req.logprobs else None}
    echo = getattr(req, "echo", False)
    return {
        "logprobs": req.logprobs,
        "prompt_logprobs": echo and (req.logprobs is not None or max_tokens == 0),
    }


def max_tokens_given(req: _Request) -> bool:
    """Whether the client asked for a length (null counts as not asking)."""
    return any(getattr(req, n, None) is not None for n in ("max_tokens", "max_completion_tokens"))


def sse_event(data: Dict[str, Any] | str) -> str:
    """One server-sent event: a `data:` line and the blank line that ends the event."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n"


SSE_DONE = sse_event("[DONE]")


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def choice(
    chat: bool,
    stream: bool,
    text: str,
    finish_reason: str | None,
    token_ids: List[int] | None,
    first: bool = False,
) -> Dict[str, Any]:
    """One choice of a response or of a streamed chunk, in the OpenAI API's shape.

    Receives: `chat` (a chat completion, else a text completion), `stream` (a chunk, else a whole
        response), `text`, `finish_reason` (None until the last), `token_ids` (None unless the
        client asked for them), `first` (the first chunk of a chat stream).
    Returns: a dict with "index" 0, "logprobs" None and "finish_reason", and: for a completion
        "text"; for a whole chat "message" {"role": "assistant", "content": text}; for a
        chat chunk "delta" {"content": text}, with "role": "assistant" too in the first one.
        "token_ids" only when `token_ids` is not None.
    Leaves: nothing changed.
    Uses: plain dicts; `envelope` wraps the result (ch15).
    Checked: each of the four shapes, key for key, and what the official openai client parses
        (Completion, ChatCompletion, ChatCompletionChunk); the role only in a chat stream's first
        chunk; token ids only when asked.
    """
    out: Dict[str, Any] = {"index": 0}
    if not chat:
        out["text"] = text
    elif stream:
        out["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    else:
        out["message"] = {"role": "assistant", "content": text}
    out["logprobs"] = None
    out["finish_reason"] = finish_reason
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out


def joined_logprobs(pieces: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One answer's logprobs from its replies' pieces (each in the response's shape, whose values
    are all lists: a completion's four, a chat's "content"), each list joined in order."""
    return {key: [v for piece in pieces for v in piece[key]] for key in pieces[0]}


def envelope(
    chat: bool, stream: bool, rid: str, created: int, model: str, choices: List[Dict[str, Any]]
) -> Dict[str, Any]:
    if chat:
        obj = "chat.completion.chunk" if stream else "chat.completion"
    else:
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
