"""A hybrid model's per-request state in the engine (Qwen3-Next, Qwen3.5): what the engine refuses
for it, what its state pool costs and where the pool comes from.

The state pool (minisgl/kvcache/state_pool.py) has one row per request slot, scratch row
included, like the page table. Its size does not depend on the context length, so the memory plan
takes it off the budget before the KV pages are counted (context.py).

The radix prefix cache is refused: a DeltaNet layer's state after a prefix is not stored anywhere
(it is overwritten in place as the request goes on), so a prefix hit would have the KV of the
full-attention layers and nothing for the others. Storing a state checkpoint at the end of each
prompt and hitting only there is the production answer, not built here.
"""

from __future__ import annotations

import torch

from minisgl.kvcache.state_pool import StatePool
from minisgl.models import ModelConfig

from .config import EngineConfig


def check_hybrid_engine(config: EngineConfig, model: ModelConfig) -> None:
    """Refuse, naming why, what the engine does not do for a hybrid model (tensor parallelism is
    refused with the other tp_size checks, before any rank starts: sharding.check_tp_size)."""
    if model.hybrid is None:
        return
    name = f"{model.architecture} (Gated DeltaNet layers)"
    if getattr(config, "cache_type", None) == "radix":
        raise ValueError(
            f"cache_type='radix' is not supported for {name}: a DeltaNet layer keeps one state per "
            "request, rewritten in place, so a cached prefix would have no state to resume from; "
            "use cache_type='naive' (LLM(cache_type='naive'), --cache-type naive)"
        )


def state_rows(config: EngineConfig) -> int:
    """One row per request slot, plus the scratch row that CUDA graphs' padding writes to."""
    return config.max_running_req + 1


def state_pool_bytes(config: EngineConfig, model: ModelConfig, dtype: torch.dtype) -> int:
    """What the state pool of `model` takes (0 for a model without DeltaNet layers)."""
    h = model.hybrid
    if h is None:
        return 0
    per_row = StatePool.bytes_per_row(
        len(h.linear_layers),
        h.conv_channels,
        h.conv_kernel,
        h.linear_v_heads,
        h.linear_k_dim,
        h.linear_v_dim,
        dtype,
    )
    return state_rows(config) * per_row


def state_pool_within(
    config: EngineConfig, model: ModelConfig, dtype: torch.dtype, share: int
) -> int:
    """The state pool's bytes, taken from a memory `share` of `share` bytes: ValueError naming
    max_running_req when it would leave less than a quarter of the share for KV pages."""
    need = state_pool_bytes(config, model, dtype)
    if need > share * 3 // 4:
        raise ValueError(
            f"the DeltaNet state of {state_rows(config)} request slots (max_running_req="
            f"{config.max_running_req}, plus one) takes {need / 2**30:.2f} GiB of the "
            f"{share / 2**30:.2f} GiB the pool may use, leaving too little for KV pages; lower "
            "max_running_req or raise memory_ratio"
        )
    return need


def create_state_pool(
    config: EngineConfig, model: ModelConfig, dtype: torch.dtype, device: torch.device
) -> StatePool | None:
    h = model.hybrid
    if h is None:
        return None
    return StatePool(
        len(h.linear_layers),
        state_rows(config),
        h.conv_channels,
        h.conv_kernel,
        h.linear_v_heads,
        h.linear_k_dim,
        h.linear_v_dim,
        dtype,
        device,
    )
