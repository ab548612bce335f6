"""The data every layer of the engine shares: sampling parameters, requests, batches, and the
per-forward context.

A request's lengths are the heart of the scheduler. For a request with prompt length P that has
produced k tokens on the device:

    cached_len      tokens whose KV is already in the cache (written by an earlier step)
    device_len      tokens the device knows about: P + k
    max_device_len  P + max_tokens: the request may not grow past this

`device_len - cached_len` tokens go through the model in the next step (the "extend" part).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, List, Literal

import torch

_UNSET: Any = object()  # a SamplingParams argument the caller did not give
SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "max_tokens",
    "ignore_eos",
    "stop",
    "stop_token_ids",
    "seed",
    "logprobs",
    "prompt_logprobs",
)
MAX_LOGPROBS = 20  # the most alternatives a request may ask for at each position (OpenAI's limit)


@dataclass(init=False)
class SamplingParams:
    """How to pick each next token. `temperature == 0` (or `top_k == 1`) means greedy.

    Beyond the draw itself:
      stop            strings that end the request; the text returned ends before the first one
                      (a single string is taken as a list of one)
      stop_token_ids  token ids that end the request as EOS does (the token is not in the text)
      seed            this request's own random draws: the same seed gives the same tokens whatever
                      else is in the batch; None draws from the engine's generator
      logprobs        None, or k in [0, 20]: each generated token's log-probability and its top-k
                      alternatives (log_softmax of the raw logits, before temperature, in float32)
      prompt_logprobs the same for every prompt token after the first; the prompt skips the prefix
                      cache (a cached prefix has no logits). With it, `max_tokens` may be 0: the
                      prompt is scored and nothing is generated

    `fields_set` names the fields the caller gave the constructor; the others hold the defaults
    below, which a model's generation_config.json may replace when the request is taken in
    (`with_defaults`). Assigning a field later does not add it: build a new SamplingParams."""

    temperature: float = 0.0
    top_k: int = -1  # -1: no top-k filtering
    top_p: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop: List[str] = field(default_factory=list)
    stop_token_ids: List[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: bool = False
    # a list, not a set: it travels in messages as plain JSON (minisgl/message/wire.py)
    fields_set: List[str] = field(default_factory=list, compare=False, repr=False)

    def __init__(
        self,
        temperature: float = _UNSET,
        top_k: int = _UNSET,
        top_p: float = _UNSET,
        max_tokens: int = _UNSET,
        ignore_eos: bool = _UNSET,
        stop: str | List[str] = _UNSET,
        stop_token_ids: List[int] = _UNSET,
        seed: int | None = _UNSET,
        logprobs: int | None = _UNSET,
        prompt_logprobs: bool = _UNSET,
        fields_set: Iterable[str] | None = None,
    ) -> None:
        """`fields_set`: which fields count as given, when the values come with defaults of their
        own (the OpenAI API's: a field the client did not send) or from a message (wire.py)."""
        values = (temperature, top_k, top_p, max_tokens, ignore_eos)
        values += (stop, stop_token_ids, seed, logprobs, prompt_logprobs)
        given = dict(zip(SAMPLING_FIELDS, values))
        given = {name: value for name, value in given.items() if value is not _UNSET}
        if isinstance(given.get("stop"), str):
            given["stop"] = [given["stop"]]
        for name in SAMPLING_FIELDS:
            default = [] if name in ("stop", "stop_token_ids") else getattr(SamplingParams, name)
            value = given.get(name, default)
            # lists are copied: a caller's list changed later must not change this request
            setattr(self, name, list(value) if isinstance(value, (list, tuple)) else value)
        names = sorted(given) if fields_set is None else sorted(set(fields_set))
        unknown = [n for n in names if n not in SAMPLING_FIELDS]
        if unknown:
            raise ValueError(f"fields_set names no sampling field: {unknown}")
        self.fields_set = names
        self.validate()

    def with_defaults(self, defaults: "dict[str, Any]") -> "SamplingParams":
        """A copy in which each field not set here takes its value from `defaults` (a model's
        generation defaults), if `defaults` has one; set fields are kept."""
        values = {f: getattr(self, f) for f in SAMPLING_FIELDS}
        values.update({k: v for k, v in defaults.items() if k not in self.fields_set})
        return SamplingParams(**values, fields_set=self.fields_set)

    def validate(self) -> None:
        """Raise TypeError (wrong type; a bool is not a number here) or ValueError (NaN, infinite,
        out of range) naming the field. `generate` calls it again: fields can change after
        __init__."""
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        for name in ("top_k", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        self._validate_extras()
        if self.max_tokens < 0 or (self.max_tokens == 0 and not self.prompt_logprobs):
            raise ValueError(
                f"max_tokens must be an integer >= 1 (0 only with prompt_logprobs), "
                f"got {self.max_tokens!r}"
            )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or an integer >= 1, got {self.top_k!r}")

    def _validate_extras(self) -> None:
        """The fields beyond the draw: stops, seed, logprobs (validate's TypeError/ValueError)."""
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise TypeError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if any(s == "" for s in self.stop):
            raise ValueError("stop must not hold an empty string (it would end every request)")
        ids = self.stop_token_ids
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            raise TypeError(f"stop_token_ids must be a list of integers, got {ids!r}")
        if any(i < 0 for i in ids):
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {ids!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise TypeError(f"seed must be an integer or None, got {self.seed!r}")
        if self.logprobs is not None:
            if not _is_int(self.logprobs):
                raise TypeError(f"logprobs must be an integer or None, got {self.logprobs!r}")
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if not isinstance(self.prompt_logprobs, bool):
            raise TypeError(f"prompt_logprobs must be True or False, got {self.prompt_logprobs!r}")

    @property
    def top_logprobs(self) -> int:
        """How many alternatives each scored position reports (0 when only the token's own)."""
        return self.logprobs or 0

    @property
    def is_greedy(self) -> bool:
        """Whether sampling can be skipped for the argmax: no temperature, or only one candidate.

        Receives: the settings: `temperature` (>= 0), `top_k` (-1 for off, or >= 1), `top_p`.
        Returns: a bool: True when the argmax is the only possible choice.
        Leaves: nothing changed (a property that only reads).
        Uses: `self.temperature`, `self.top_k` (ch01); top_p plays no part.
        Checked: greedy detection over temperature, top_k and top_p combinations.
        """
        return self.temperature == 0.0 or self.top_k == 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(eq=False)
class Req:
    """One request as the scheduler sees it. `eq=False`: requests are compared by identity, so they
    can live in sets and dicts even though their fields change."""

    input_ids: torch.Tensor  # int32 on the CPU: the prompt, then every token the CPU has received
    table_idx: int  # its row in the page table and the token pool
    cached_len: int
    output_len: int  # max_tokens
    uid: int
    sampling_params: SamplingParams
    cache_handle: Any = None  # what the prefix cache gave it (locked while the request runs)
    device_len: int = field(init=False)
    max_device_len: int = field(init=False)
    # A piece of a prompt prefilled in parts (ChunkedReq, chapter 10) says so here; every other
    # request is a whole one. A class attribute, not a field: it is what the request is, not state.
    is_chunk = False

    def __post_init__(self) -> None:
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.output_len

    @property
    def remain_len(self) -> int:
        """How many more tokens the device may still produce for this request."""
        return self.max_device_len - self.device_len

    @property
    def extend_len(self) -> int:
        """How many tokens the next forward pass must process for this request.

        Receives: the request: `device_len` tokens known to the device, `cached_len` of them with KV
            in the cache.
        Returns: an int, the known tokens not yet in the cache (the prompt at prefill, less a prefix
            the cache already had; 1 at every decode step).
        Leaves: nothing changed (a property that only reads).
        Uses: `self.device_len`, `self.cached_len` (ch01).
        Checked: it counts the uncached tokens and follows device_len; the lengths through a prefill
            and decode steps.
        """
        return self.device_len - self.cached_len

    @property
    def can_decode(self) -> bool:
        """Whether the device may run one more decode step for this request.

        A request may grow until it has produced max_tokens tokens; the device's count already
        includes the token being sampled, so this is known before that token reaches the CPU.

        Receives: the request: `device_len` and `max_device_len` (prompt + max_tokens).
        Returns: a bool: True while the device may still produce a token for it.
        Leaves: nothing changed (a property that only reads).
        Uses: `self.remain_len` or the lengths it is made of (ch01).
        Checked: True until device_len reaches max_device_len, False from then on; the lengths
            through a prefill and decode steps.
        """
        return self.remain_len > 0

    def complete_one(self) -> None:
        """Advance the request's lengths by one step, right after its forward pass is launched.

        After the pass everything the device knew is cached, and the device will know one token
        more: the one being sampled, whose value the CPU does not have yet.

        Receives: the request, lengths as they were for the step just launched (`cached_len` <=
            `device_len` <= `max_device_len`).
        Returns: nothing.
        Leaves: `cached_len` = the old `device_len`; `device_len` one higher. `max_device_len` and
            `input_ids` unchanged (the token's value arrives later, through `append_host`).
        Uses: `self.cached_len`, `self.device_len` (ch01).
        Checked: everything moves into the cache and one token is added; the lengths through a
            prefill and decode steps up to max_tokens.
        """
        self.cached_len = self.device_len
        self.device_len += 1

    def append_host(self, next_token: torch.Tensor) -> None:
        """Record a token that has arrived on the CPU."""
        self.input_ids = torch.cat([self.input_ids, next_token.to(self.input_ids.dtype)])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(uid={self.uid}, table_idx={self.table_idx}, "
            f"cached_len={self.cached_len}, "
            f"device_len={self.device_len}, max_device_len={self.max_device_len})"
        )


@dataclass(eq=False)
class Batch:
    """The requests of one forward pass, and the tensors the scheduler prepared for it."""

    reqs: List[Req]
    phase: Literal["prefill", "decode"]
    # Filled in by the scheduler before the forward pass:
    input_ids: torch.Tensor | None = None  # gathered from the token pool on the engine stream
    positions: torch.Tensor | None = None
    out_loc: torch.Tensor | None = None  # KV-cache slot of every token processed
    # minisgl/attention/metadata.py's AttentionMetadata (not imported: attention builds on core)
    attn_metadata: Any = None
    # Which hidden rows the LM head turns into logits at prefill: None means each request's last
    # (attn_metadata.last_indices); a batch with a request asking for prompt logprobs lists more
    # (minisgl/engine/request_sampling.py)
    logit_rows: torch.Tensor | None = None
    step: int = 0  # a running number, for the event log

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def size(self) -> int:
        return len(self.reqs)


class Context:
    """What a layer deep inside the model needs to know about the current forward pass (the batch
    and
    the attention backend) without every forward() passing it along."""

    def __init__(
        self,
        page_size: int,
        kv_cache: Any = None,
        attn_backend: Any = None,
        fused_kernels: Any = None,
    ) -> None:
        self.page_size = page_size
        self.kv_cache = kv_cache
        self.attn_backend = attn_backend
        self.fused_kernels = (
            fused_kernels  # this engine's Triton kernel module, or None (kernel/dispatch.py)
        )
        self._batch: Batch | None = None

    @property
    def batch(self) -> Batch:
        if self._batch is None:
            raise RuntimeError("no batch is being run: use `with ctx.forward_batch(batch):`")
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[Batch]:
        """Run `batch` in this context. The context also becomes the global one for the duration, so
        two engines in one process (two LLM objects) each run their layers with their own cache."""
        global _GLOBAL_CTX
        if self._batch is not None:
            raise RuntimeError("a forward pass is already running in this context")
        previous, _GLOBAL_CTX = _GLOBAL_CTX, self
        self._batch = batch
        try:
            yield batch
        finally:
            self._batch = None
            _GLOBAL_CTX = previous


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context | None) -> None:
    global _GLOBAL_CTX
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    if _GLOBAL_CTX is None:
        raise RuntimeError("no engine context: build an Engine first")
    return _GLOBAL_CTX


def current_ctx() -> Context | None:
    """The context of the engine running now (or built last), or None before any engine."""
    return _GLOBAL_CTX
