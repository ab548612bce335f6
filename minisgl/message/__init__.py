"""Messages to and from the scheduler: from the tokenizer worker (or, offline, `LLM`) and back.

The offline `LLM` passes them in-process; the server (minisgl/server/) sends the same objects over
ZMQ sockets, encoded by `wire.py`. The API server's messages to and from the tokenizer worker are
in `api_server.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import torch

from minisgl.core import SamplingParams


@dataclass
class UserMsg:
    """A new request: token ids and how to sample them."""

    uid: int
    input_ids: torch.Tensor  # int32, on the CPU
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg:
    """The client went away: stop the request and give back what it holds."""

    uid: int


@dataclass
class DetokenizeMsg:
    """One generated token of request `uid`; `finished` on its last one. A request the scheduler
    refuses gets a single message with `next_token = -1`, `finished = True` and an `error`."""

    uid: int
    next_token: int
    finished: bool
    error: str | None = None
    # Only for a request that asked (SamplingParams.logprobs / prompt_logprobs): "token": [its
    # logprob, [[id, logprob], ...] top alternatives]; on its first message, "prompt": one such
    # entry for each prompt token after the first.
    logprobs: Dict[str, Any] | None = None


BackendMsg = UserMsg | AbortBackendMsg

from .api_server import AbortMsg, StatsQuery, StatsReply, TokenizeMsg, UserReply  # noqa: E402

__all__ = [
    "UserMsg",
    "AbortBackendMsg",
    "DetokenizeMsg",
    "BackendMsg",
    "TokenizeMsg",
    "AbortMsg",
    "StatsQuery",
    "StatsReply",
    "UserReply",
]
