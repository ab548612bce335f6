from __future__ import annotations

import torch

from .config import ModelConfig
from .decoder import CausalLM


class Qwen3ForCausalLM(CausalLM):
    """Qwen3: GQA, per-head q/k RMSNorm, NeoX RoPE, SwiGLU; the switch lives in the config."""

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        assert cfg.architecture == "qwen3"
        super().__init__(cfg, dtype, device, max_positions)
