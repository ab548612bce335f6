"""Small random Qwen3.5 and Qwen3-Next checkpoints written by transformers, for test_hybrid.py.

Kept apart from checkpoints.py's RECIPES: that matrix runs every checkpoint with the radix cache,
which the engine refuses for hybrid models (minisgl/engine/state.py).

transformers initializes every (1 + w) RMSNorm's w to 0 and the DeltaNet output norm's to 1, so a
norm read as w instead of 1 + w, or the other way round, would still hide behind those constants:
`_perturb` moves every norm weight and the decay parameters by seeded noise before the file is
written, so each of them changes the tokens. 4 layers (3 DeltaNet, 1 full attention unless the
recipe says otherwise), hidden size 64, a 256-token vocabulary; each builds in about a second and
is cached under `.cache/checkpoints/` like checkpoints.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Dict

import torch

from checkpoints import CACHE

HYBRID = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.2,
)
NEXT_MOE = dict(
    HYBRID,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)

# name -> (transformers config class, its fields)
HYBRID_RECIPES: Dict[str, tuple] = {
    "qwen3_5": ("Qwen3_5TextConfig", HYBRID),
    # one KV head, tied embeddings, half of each head rotated, one key head per value head, a
    # 3-wide convolution, two full-attention layers (first and last)
    "qwen3_5-kv1-tied-rot50-conv3": (
        "Qwen3_5TextConfig",
        dict(
            HYBRID,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5
            ),
            linear_num_value_heads=2,
            linear_conv_kernel_dim=3,
            layer_types=[
                "full_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ],
        ),
    ),
    "qwen3_5-bf16": ("Qwen3_5TextConfig", dict(HYBRID, dtype="bfloat16")),
    "qwen3_next-moe": ("Qwen3NextConfig", NEXT_MOE),
    # every layer dense (the MoE off), tied, four KV heads (no grouping), 4 value heads per key head
    "qwen3_next-dense-tied": (
        "Qwen3NextConfig",
        dict(
            NEXT_MOE,
            mlp_only_layers=[0, 1, 2, 3],
            tie_word_embeddings=True,
            num_key_value_heads=4,
            linear_num_key_heads=1,
        ),
    ),
    # every second layer sparse, the router's weights not renormalised, one KV head
    "qwen3_next-step2-kv1": (
        "Qwen3NextConfig",
        dict(NEXT_MOE, decoder_sparse_step=2, norm_topk_prob=False, num_key_value_heads=1),
    ),
    # the vision-language Qwen3.5: the engine runs its language model
    "qwen3_5-vl": ("Qwen3_5Config", dict(text_config=HYBRID, vision_config=VISION)),
}


def _key(name: str) -> str:
    import transformers

    blob = json.dumps([HYBRID_RECIPES[name], transformers.__version__, 1], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _perturb(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(("norm.weight", "A_log", "dt_bias")):
                p.add_(0.3 * torch.randn(p.shape, generator=g).to(p.dtype))


def hybrid_checkpoint(name: str) -> Path:
    """The directory of checkpoint `name` (HYBRID_RECIPES), built on first use."""
    path = CACHE / f"{name}-{_key(name)}"
    if (path / "config.json").is_file():
        return path
    import transformers

    cls_name, fields = HYBRID_RECIPES[name]
    config = getattr(transformers, cls_name)(**fields)
    torch.manual_seed(0)
    if cls_name == "Qwen3_5Config":
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.float().eval()
    _perturb(model)
    model = model.to(getattr(torch, fields.get("dtype", "float32")))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    try:
        tmp.rename(path)
    except OSError:  # another test process built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return path
