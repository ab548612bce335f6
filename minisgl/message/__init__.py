"""Messages to and from the scheduler: from the tokenizer worker (or, offline, `LLM`) and back.

The offline `LLM` passes them in-process; the server (minisgl/server/) sends the same objects over
ZMQ sockets, encoded by `wire.py`. The API server's messages to and from the tokenizer worker are
in `api_server.py`."""

from __future__ import annotations

from dataclasses import dataclass

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
