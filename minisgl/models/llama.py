from __future__ import annotations

import torch

from .config import ModelConfig
from .decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    """Llama: the same decoder as Qwen3 without the per-head q/k norm."""

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        assert cfg.architecture == "llama"
        super().__init__(cfg, dtype, device, max_positions)
