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

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterator, List, Literal

import torch

from minisgl import sampling_checks as checks

MAX_LOGPROBS = 20  # the most alternatives a request may ask for at each position (OpenAI's limit)


def _rule(default: Any, *rules: checks.Check) -> Any:
    """A SamplingParams field: its default (a list is copied for each instance) and the checks its
    value must pass, in order (minisgl/sampling_checks.py)."""
    metadata = {"checks": rules}
    if isinstance(default, list):
        return field(default_factory=default.copy, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
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
      constraint      None, or what the output must be: {"json_schema": {...}}, {"json_object":
                      True}, {"regex": "..."}, {"choice": [...]}, {"lark": "..."}
                      (minisgl/structured/constraint.py); each step's logits are masked to the
                      tokens the grammar allows before temperature, top-k and top-p, and EOS only
                      where it may end

    A field is one line here: its default and its checks. `fields_set` says which fields the caller
    chose; the others may take a model's generation_config.json defaults when the request is taken
    in (`with_defaults`). None, the default, means all of them: a SamplingParams built in code means
    what it says. The edges that know what a caller left out fill it in: the OpenAI server (the
    fields a client sent, pydantic's `model_fields_set`) and `LLM.generate`'s keyword arguments."""

    temperature: float = _rule(0.0, checks.number, checks.at_least(0))
    top_k: int = _rule(-1, checks.integer, checks.top_k)  # -1: no top-k filtering
    top_p: float = _rule(1.0, checks.number, checks.top_p)
    max_tokens: int = _rule(16, checks.integer)  # >= 1, or 0 with prompt_logprobs (validate)
    ignore_eos: bool = _rule(False, checks.boolean)
    stop: List[str] = _rule([], checks.strings)
    stop_token_ids: List[int] = _rule([], checks.token_ids)
    seed: int | None = _rule(None, checks.optional(checks.integer))
    logprobs: int | None = _rule(
        None, checks.optional(checks.integer), checks.optional(checks.between(0, MAX_LOGPROBS))
    )
    prompt_logprobs: bool = _rule(False, checks.boolean)
    constraint: dict | None = _rule(None, checks.constraint)  # None: free output
    # a list, not a set: it travels in messages as plain JSON (minisgl/message/wire.py)
    fields_set: List[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for f in fields(self):  # lists are copied: a caller's list changed later stays theirs
            value = getattr(self, f.name)
            if isinstance(value, (list, tuple)):
                setattr(self, f.name, list(value))
            elif isinstance(value, dict):  # a constraint: its nested lists and dicts too
                setattr(self, f.name, copy.deepcopy(value))
        if isinstance(self.fields_set, (list, set, frozenset)):
            self.fields_set = sorted(set(self.fields_set))
        self.validate()

    def is_set(self, name: str) -> bool:
        """Whether the caller chose field `name` (a model's default may replace it otherwise)."""
        return self.fields_set is None or name in self.fields_set

    def with_defaults(self, defaults: "dict[str, Any]") -> "SamplingParams":
        """A copy in which each field not set here takes its value from `defaults` (a model's
        generation defaults), if `defaults` has one; set fields are kept."""
        return replace(self, **{k: v for k, v in defaults.items() if not self.is_set(k)})

    def validate(self) -> None:
        """Raise TypeError (wrong type; a bool is not a number here) or ValueError (NaN, infinite,
        out of range) naming the field. `generate` calls it again: fields can change after
        __init__."""
        for f in fields(self):
            for check in f.metadata.get("checks", ()):
                check(f.name, getattr(self, f.name))
        if self.max_tokens < 0 or (self.max_tokens == 0 and not self.prompt_logprobs):
            raise ValueError(
                f"max_tokens must be an integer >= 1 (0 only with prompt_logprobs), "
                f"got {self.max_tokens!r}"
            )
        if self.constraint is not None and self.ignore_eos:
            raise ValueError(
                "ignore_eos cannot go with a constraint: a constrained request ends with EOS where "
                "its grammar ends"
            )
        chosen = self.fields_set
        if chosen is not None and (
            not isinstance(chosen, list) or not all(isinstance(n, str) for n in chosen)
        ):
            raise TypeError(f"fields_set must be None or a list of field names, got {chosen!r}")
        names = {f.name for f in fields(self)} - {"fields_set"}
        unknown = [n for n in chosen or () if n not in names]
        if unknown:
            raise ValueError(f"fields_set names no sampling field: {unknown}")

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
    # "verify": a decode step that also scores drafted tokens (speculative decoding, chapter 24)
    phase: Literal["prefill", "decode", "verify"]
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
    # A mixed step (chapter 23, scheduler/load.py) runs as a prefill whose last rows are decode
    # tokens of running requests: how many, so its handling caches only the prefill rows' prompts
    mixed_decodes: int = 0

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
