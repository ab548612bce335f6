"""Model definitions and loading: `load_model(dir, dtype, device)` builds the model on the meta
device (no memory, no time spent on random init), then fills it from the checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from minisgl.distributed import SINGLE, Collectives

from .config import ModelConfig
from .decoder import CausalLM
from .hybrid import Qwen3_5ForCausalLM, Qwen3NextForCausalLM
from .llama import LlamaForCausalLM
from .qwen2 import Qwen2ForCausalLM
from .qwen3 import Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM
from .sharding import Shard, parallelize, rank_config
from .weight import check_cast_values, load_weight, reading_shard

_CLASSES = {
    "qwen3": Qwen3ForCausalLM,
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "qwen3_next": Qwen3NextForCausalLM,
    "qwen3_5": Qwen3_5ForCausalLM,
}

BUNDLED_MODEL = Path(__file__).resolve().parent.parent / "assets" / "shakespeare-qwen3"


def create_model(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_positions: int | None = None
) -> CausalLM:
    """`max_positions`: the length of RoPE's table (None: the model's max_position_embeddings)."""
    return _CLASSES[cfg.architecture](cfg, dtype, device, max_positions)


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int | None = None,
    comm: Collectives = SINGLE,
) -> CausalLM:
    """`max_positions` as in create_model; the engine passes 0 and sizes the table by its context
    length once it knows it (`CausalLM.size_rotary`). With a tensor-parallel `comm` of several
    ranks, the model is this rank's part (sharding.py), and only its slices are read."""
    cfg = ModelConfig.from_dir(model_dir)
    if comm.size == 1:
        model = create_model(cfg, dtype, torch.device("meta"), max_positions)
        state = load_weight(model, model_dir, device)
    else:
        local = rank_config(cfg, comm.size)
        model = create_model(local, dtype, torch.device("meta"), max_positions)
        parallelize(model, cfg, comm)
        with reading_shard(Shard(cfg, comm.rank, comm.size)):
            state = load_weight(model, model_dir, device)
    check_cast_values(state or {})  # (a learner's load_weight may return nothing)
    model.move_rotary(device)
    return model


__all__ = [
    "ModelConfig",
    "CausalLM",
    "Qwen3ForCausalLM",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "load_weight",
    "create_model",
    "load_model",
    "BUNDLED_MODEL",
]
