"""The engine's context length and KV pool size, decided together.

The context length is the longest request (prompt + output) the engine takes. Every table indexed
by a position is sized by it, never by the model's own limit: the page table and the token pool
(one row per request slot) and RoPE's cos/sin table. A model's `max_position_embeddings` can be
131,072 (Llama 3.1) or 2**31 - 1 (a config transformers loads): tables that long would not fit.

It is `max_seq_len_override` when set (at most the model's limit), else the model's limit capped
at what the KV pool holds (a longer request could never get its pages anyway). On a GPU the pool
takes a share of free memory, and the tables come out of the same share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from minisgl.kvcache import KVCache
from minisgl.models import ModelConfig

from .config import EngineConfig
from .state import state_pool_within

_INT32 = 4
_FLOAT32 = 4


@dataclass(frozen=True)
class PoolPlan:
    num_pages: int
    max_seq_len: int  # the context length


def table_bytes_per_position(config: EngineConfig, model: ModelConfig) -> int:
    """What each position of the context costs in tables: an int32 entry per row (request slots
    plus the scratch row) of the page table and of the token pool, and RoPE's float32 cos and sin
    (head_dim / 2 each)."""
    rows = config.max_running_req + 1
    return 2 * rows * _INT32 + model.head_dim * _FLOAT32


def plan_pool(
    config: EngineConfig,
    model: ModelConfig,
    dtype: torch.dtype,
    free_bytes: int | None,
    agree: Callable[[int], int] = lambda pages: pages,
) -> PoolPlan:
    """The KV pool's pages and the context length. `free_bytes`: the device's free memory (a GPU),
    or None (a CPU: the pool holds `cpu_kv_tokens`). `model`: the model this process runs (one
    tensor-parallel rank's KV heads). `agree`: the pages every rank can have, given this one's
    (tensor parallelism: the smallest of the ranks', so that every rank's pool is the same and
    rank 0's page numbers are valid everywhere)."""
    limit = model.max_position_embeddings
    override = config.max_seq_len_override
    if override is not None and override > limit:
        # RoPE's frequencies and the attention kernels are trained and checked up to the model's
        # limit: past it a step would index out of range or silently go wrong.
        raise ValueError(
            f"max_seq_len_override={override} exceeds the model's max_position_embeddings ({limit})"
        )
    page_size = config.page_size
    if config.num_page_override is not None:
        num_pages = config.num_page_override
    elif free_bytes is None:
        num_pages = max(1, config.cpu_kv_tokens // page_size)
    else:
        num_pages = _gpu_pages(
            config, model, dtype, free_bytes, override or limit, override is not None
        )
    num_pages = agree(num_pages)
    max_seq_len = override or min(limit, num_pages * page_size)
    window = model.sliding_window
    if window is not None and window < max_seq_len:
        # Past the window a token would attend to more than the model was built to see: plausible
        # but wrong tokens. Sliding-window attention is not implemented; a shorter context is exact.
        raise ValueError(
            f"MistralForCausalLM with sliding_window={window} is not supported at the context "
            f"length {max_seq_len}: sliding-window attention is not implemented; it runs exactly "
            f"with max_seq_len_override <= {window} (LLM(max_seq_len_override=...), "
            "--max-seq-len), or a checkpoint whose sliding_window is null"
        )
    return PoolPlan(num_pages, max_seq_len)


def _gpu_pages(
    config: EngineConfig,
    model: ModelConfig,
    dtype: torch.dtype,
    free_bytes: int,
    longest: int,
    fixed: bool,
) -> int:
    """As many pages as the memory share holds once the tables are paid for: tables `longest`
    positions long when that length is `fixed` (asked for) or the pool outgrows it, else as long as
    the pool itself."""
    share = int(free_bytes * config.memory_ratio)
    # a hybrid model's state pool (state.py) is a fixed cost per request slot, paid before any
    # page (refused if it leaves none), and its pages hold KV of the full-attention layers only
    budget = share - state_pool_within(config, model, dtype, share)
    per_page = KVCache.bytes_per_page(
        model.num_kv_layers, config.page_size, model.num_kv_heads, model.head_dim, dtype
    )
    per_position = table_bytes_per_position(config, model)
    pages = (budget - longest * per_position) // per_page
    if not fixed and pages * config.page_size < longest:
        # the pool is the shorter: the context length, and so the tables, as long as the pool
        pages = budget // (per_page + config.page_size * per_position)
    return max(1, pages)
