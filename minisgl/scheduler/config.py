from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig


@dataclass
class SchedulerConfig(EngineConfig):
    cache_type: str = "radix"  # "radix" or "naive"
    max_extend_tokens: int = 8192  # prefill token budget per step; longer prompts are chunked
    # True: the overlap loop, False: the normal loop; None: MINISGL_DISABLE_OVERLAP_SCHEDULING
    # decides at every step (tests and notebooks flip it mid-run)
    overlap_scheduling: bool | None = None
    # the order the waiting queue is offered to the prefill batch (policy.py): "fcfs", arrival
    # order; "lpm", longest cached prefix first while at most `lpm_max_queue` requests wait (past
    # that, matching every waiting prompt each step costs more than it saves: FCFS again)
    schedule_policy: str = "fcfs"
    lpm_max_queue: int = 128
    # True: admit a request on an estimate of the tokens it will generate, and retract a running
    # request when a decode step finds no free page (retract.py); False (the chapters' engine):
    # reserve each request's whole life (prompt + max_tokens) at admission, so no request ever
    # runs out of pages
    optimistic_admission: bool = False
    # the first estimate of the share of max_tokens a request generates (SGLang's
    # init_new_token_ratio); it then learns from the requests that end (retract.TokenRatio)
    init_new_token_ratio: float = 0.7
    # a request retracted this often is readmitted with its whole life reserved and never
    # retracted again: the bound on how often one request can lose its work
    max_retractions: int = 2
    # True: a prefill step carries the running requests' decode tokens too, under the one token
    # budget (load.py), so decoding goes on while a long prompt is chunked
    mixed_batches: bool = False
    # speculative decoding (minisgl/scheduler/speculative.py): None (off), "lookup" (prompt lookup
    # over each request's own tokens) or "draft" (a small model, `draft_model`, proposes); each
    # decode step then verifies up to `num_speculative_tokens` drafted tokens per request
    speculative: str | None = None
    num_speculative_tokens: int = 4
    draft_model: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cache_type not in ("radix", "naive"):
            raise ValueError(f"cache_type must be 'radix' or 'naive', got {self.cache_type!r}")
        value = self.max_extend_tokens
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"max_extend_tokens must be an integer, got {type(value).__name__} {value!r}"
            )
        if self.max_extend_tokens < 1:
            raise ValueError("max_extend_tokens must be >= 1")
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ValueError(
                f"schedule_policy must be 'fcfs' or 'lpm', got {self.schedule_policy!r}"
            )
        for name in ("lpm_max_queue", "max_retractions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        ratio = self.init_new_token_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"init_new_token_ratio must be a number in (0, 1], got {ratio!r}")
        for name in ("optimistic_admission", "mixed_batches"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self._check_speculative()
        if self.overlap_scheduling is not None and not isinstance(self.overlap_scheduling, bool):
            raise TypeError(
                f"overlap_scheduling must be True, False or None, got {self.overlap_scheduling!r}"
            )

    def _check_speculative(self) -> None:
        kind, k = self.speculative, self.num_speculative_tokens
        if kind not in (None, "lookup", "draft"):
            raise ValueError(f"speculative must be 'lookup', 'draft' or None, got {kind!r}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, 64], got {k!r}")
        if kind == "draft" and self.draft_model is None:
            raise ValueError("speculative='draft' needs draft_model, the draft model's directory")
        if kind != "draft" and self.draft_model is not None:
            raise ValueError(
                f"draft_model is given but speculative is {kind!r}: pass speculative='draft'"
            )
        if kind is not None:  # a verify step is k + 1 decode rows per request (decode_rows.py)
            self.cuda_graph_rows_per_req = max(self.cuda_graph_rows_per_req, k + 1)
