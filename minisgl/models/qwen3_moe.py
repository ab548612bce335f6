from __future__ import annotations

import torch

from .config import ModelConfig
from .decoder import CausalLM


class Qwen3MoeForCausalLM(CausalLM):
    """Qwen3-MoE: Qwen3's attention (GQA, per-head q/k RMSNorm, NeoX RoPE); the MLP of each layer
    in `cfg.moe.sparse_layers` is a router and experts (models/moe.py), the others' dense."""

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        assert cfg.architecture == "qwen3_moe"
        if cfg.moe is None:
            raise ValueError(
                "a qwen3_moe ModelConfig needs its experts: build it with ModelConfig.from_dir, "
                "or ModelConfig.with_experts(ModelConfig.from_hf(raw), raw)"
            )
        super().__init__(cfg, dtype, device, max_positions)
