"""Messages between the API server and the tokenizer worker (the scheduler never sees these).

The API server knows HTTP and text; the tokenizer worker knows the tokenizer and the chat template;
the scheduler knows token ids. Each hop has its own messages:

    API server --TokenizeMsg / AbortMsg / StatsQuery--> tokenizer worker --UserMsg / AbortBackendMsg
    / StatsQuery--> scheduler --DetokenizeMsg / StatsReply--> tokenizer worker --UserReply /
    StatsReply--> API server
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from minisgl.core import SamplingParams


@dataclass
class TokenizeMsg:
    """A new request as the client sent it. Exactly one of `text`, `input_ids` and `messages` is
    set: a completion's prompt as text or as token ids, or a chat's messages (rendered with the
    model's chat template). `fill_context`: max_tokens is whatever the context has left after the
    prompt
    (a chat request that sets no max_tokens). `echo`: the answer starts with the prompt's text."""

    uid: int
    sampling_params: SamplingParams
    text: str | None = None
    input_ids: List[int] | None = None
    messages: List[Dict[str, str]] | None = None
    fill_context: bool = False
    echo: bool = False  # a completion that returns its prompt before the generated text


@dataclass
class AbortMsg:
    """The client of request `uid` went away."""

    uid: int


@dataclass
class StatsQuery:
    """Ask the scheduler how many slots and pages are free (the server's /debug/scheduler)."""

    uid: int


@dataclass
class StatsReply:
    uid: int
    stats: Dict[str, object] = field(default_factory=dict)


@dataclass
class UserReply:
    """What the API server needs to answer request `uid`: the new text (never half a character),
    the new token ids, and on the last reply `finished` with a `finish_reason` ("stop": the model
    ended it; "length": max_tokens reached). A refused or failed request gets one reply with
    `error` and the HTTP `status` to answer with. `prompt_tokens` counts the prompt (for usage)."""

    uid: int
    text: str = ""
    token_ids: List[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    error: str | None = None
    status: int = 200
    # the logprobs of this reply's tokens, in the response's own shape (a completion's
    # {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, a chat's {"content": [...]});
    # None unless the request asked (minisgl/server/reply_shaper.py)
    logprobs: Dict[str, Any] | None = None


__all__ = ["TokenizeMsg", "AbortMsg", "StatsQuery", "StatsReply", "UserReply"]
