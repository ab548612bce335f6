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
        if self.overlap_scheduling is not None and not isinstance(self.overlap_scheduling, bool):
            raise TypeError(
                f"overlap_scheduling must be True, False or None, got {self.overlap_scheduling!r}"
            )
