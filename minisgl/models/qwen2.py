from __future__ import annotations

import torch

from .config import ModelConfig
from .decoder import CausalLM


class Qwen2ForCausalLM(CausalLM):
    """Qwen2 / Qwen2.5: Llama's decoder with biases on the q, k and v projections (not on o)."""

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        assert cfg.architecture == "qwen2"
        super().__init__(cfg, dtype, device, max_positions)
