"""Messages between the frontend (tokenizer/detokenizer side) and the scheduler.

The offline `LLM` passes them in-process; an online server would send the same objects over a
socket."""

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

__all__ = ["UserMsg", "AbortBackendMsg", "DetokenizeMsg", "BackendMsg"]
