"""A queued request with the plan it is admitted on (load.py, retract.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .prefill import PendingReq


@dataclass(eq=False)
class PlannedReq(PendingReq):
    """A queued request with the plan it is admitted on."""

    # the share of max_tokens admission plans for: 1.0 reserves the whole life (reserve-all), less
    # is an estimate of what the request will really use (optimistic admission)
    reserve_ratio: float = 1.0
    retractions: int = 0  # how often it was retracted and requeued

    @property
    def total_len(self) -> int:
        """The tokens admission plans for: the prompt, plus max_tokens (reserve_ratio 1) or the
        estimated share of it (at least one token: the first is always sampled)."""
        max_tokens = self.sampling_params.max_tokens
        if self.reserve_ratio < 1:
            max_tokens = min(max_tokens, max(1, math.ceil(self.reserve_ratio * max_tokens)))
        return len(self.input_ids) + max_tokens
