"""Small random checkpoints of every supported architecture and config variant, written by
transformers itself (`save_pretrained`), for the parity matrix in test_checkpoints.py.

Each is built once and cached under `.cache/checkpoints/<name>-<key>/` (the key hashes the recipe
and the transformers version, so a changed recipe or a new transformers builds afresh). Building
one takes well under a second: 2 layers, hidden size 64, a 256-token vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Dict

import torch

from helpers import REPO

CACHE = Path(os.environ.get("MINISGL_CACHE_DIR", REPO / ".cache")) / "checkpoints"

# larger than the default 0.02: logits far apart, no ties
SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # a short original context, so the scaling changes frequencies the prompts use
    "original_max_position_embeddings": 32,
}


def _to_transformers_4_layout(model_dir: Path) -> None:
    """Rewrite config.json as transformers 4 wrote it: torch_dtype, a top-level rope_theta and
    rope_scaling (null for plain RoPE), no layer_types."""
    path = model_dir / "config.json"
    raw = json.loads(path.read_text())
    raw["torch_dtype"] = raw.pop("dtype", "float32")
    rope = dict(raw.pop("rope_parameters", None) or {})
    raw["rope_theta"] = rope.pop("rope_theta", 10000.0)
    raw["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    raw.pop("layer_types", None)
    path.write_text(json.dumps(raw, indent=2))


def _to_transformers_4_moe_layout(model_dir: Path) -> None:
    """The transformers-4 layout of a Qwen3-MoE: as above, and the expert count as num_experts
    (transformers 5 writes num_local_experts)."""
    _to_transformers_4_layout(model_dir)
    path = model_dir / "config.json"
    raw = json.loads(path.read_text())
    raw["num_experts"] = raw.pop("num_local_experts", raw.get("num_experts"))
    path.write_text(json.dumps(raw, indent=2))


# 8 experts of width 32, each token to 2 of them, 3 layers; the dense layers' MLP is wider (128)
MOE = dict(
    SMALL,
    head_dim=16,
    num_hidden_layers=3,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    norm_topk_prob=True,
)

# name -> (transformers config class name, its fields, save_pretrained options, post-processing)
RECIPES: Dict[str, tuple] = {
    "qwen3": ("Qwen3Config", dict(SMALL, head_dim=16, tie_word_embeddings=True), {}, None),
    "qwen3-bf16-untied": (
        "Qwen3Config",
        dict(SMALL, head_dim=16, tie_word_embeddings=False, dtype="bfloat16"),
        {},
        None,
    ),
    # head_dim is not hidden / heads, one KV head for all four query heads, biases on q/k/v/o
    "qwen3-head32-kv1-bias": (
        "Qwen3Config",
        dict(SMALL, head_dim=32, num_key_value_heads=1, attention_bias=True),
        {},
        None,
    ),
    # a vocabulary no tensor-parallel size divides (tests/test_tp.py pads it), an untied LM head
    "qwen3-vocab257-untied": (
        "Qwen3Config",
        dict(SMALL, head_dim=16, vocab_size=257, tie_word_embeddings=False),
        {},
        None,
    ),
    # a head size the Triton kernels do not take: on a GPU the engine falls back to torch attention
    "qwen3-head24": ("Qwen3Config", dict(SMALL, head_dim=24), {}, None),
    "qwen3-sharded-tf4": (
        "Qwen3Config",
        dict(SMALL, head_dim=16, num_key_value_heads=4),
        {"max_shard_size": "100KB"},
        _to_transformers_4_layout,
    ),
    "llama": ("LlamaConfig", dict(SMALL, tie_word_embeddings=False), {}, None),
    "llama-biases": ("LlamaConfig", dict(SMALL, attention_bias=True, mlp_bias=True), {}, None),
    "llama3-rope": (
        "LlamaConfig",
        dict(SMALL, rope_parameters=dict(LLAMA3_ROPE, rope_theta=10000.0)),
        {},
        None,
    ),
    "llama3-rope-tf4": (
        "LlamaConfig",
        dict(SMALL, rope_parameters=dict(LLAMA3_ROPE, rope_theta=10000.0)),
        {},
        _to_transformers_4_layout,
    ),
    "qwen2": ("Qwen2Config", dict(SMALL), {}, None),
    # Qwen3-MoE: transformers 5 writes each expert's projections apart (its original format) ...
    "qwen3-moe": ("Qwen3MoeConfig", MOE, {}, None),
    # ... or stacked, [experts, 2 * inter, hidden] and [experts, hidden, inter]
    "qwen3-moe-stacked-bf16": (
        "Qwen3MoeConfig",
        dict(MOE, dtype="bfloat16"),
        {"save_original_format": False},
        None,
    ),
    # layer 1 dense, the router's weights not renormalised
    "qwen3-moe-mlp-only-layers": (
        "Qwen3MoeConfig",
        dict(MOE, mlp_only_layers=[1], norm_topk_prob=False),
        {},
        None,
    ),
    # every second layer sparse (layers 1 and 3 of 4), top-1, the transformers-4 layout
    "qwen3-moe-sparse-step2-tf4": (
        "Qwen3MoeConfig",
        dict(MOE, num_hidden_layers=4, decoder_sparse_step=2, num_experts_per_tok=1),
        {},
        _to_transformers_4_moe_layout,
    ),
    # Llama's math; the window null, or longer than any sequence the tests run (the engine's context
    # length is at most max_position_embeddings, 256)
    "mistral": ("MistralConfig", dict(SMALL, sliding_window=None), {}, None),
    "mistral-window-4096": (
        "MistralConfig",
        dict(SMALL, sliding_window=4096, tie_word_embeddings=True),
        {},
        None,
    ),
}


def _key(name: str) -> str:
    import transformers

    cls, fields, save, post = RECIPES[name]
    blob = json.dumps(
        [cls, fields, save, post.__name__ if post else None, transformers.__version__],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def checkpoint(name: str) -> Path:
    """The directory of checkpoint `name` (RECIPES), built on first use."""
    path = CACHE / f"{name}-{_key(name)}"
    if (path / "config.json").is_file():
        return path
    import transformers

    cls_name, fields, save, post = RECIPES[name]
    config = getattr(transformers, cls_name)(**fields)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    # the file's dtype, as a real one's
    model = model.to(getattr(torch, fields.get("dtype", "float32")))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, **save)
    if post is not None:
        post(tmp)
    try:
        tmp.rename(path)
    except OSError:  # another test process built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return path
