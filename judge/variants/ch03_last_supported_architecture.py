"""`from_hf` that loops over `architectures` and keeps the last supported one it meets.

A config names its model class first; later entries are aliases or heads a checkpoint also
serves. With one supported entry the loop and "the first" agree; with two, the model is built as
the wrong architecture, and its weights do not fit it (or, worse, they do).
"""

import torch


@classmethod
def from_hf(cls, raw):
    archs = raw.get("architectures") or []
    arch = None
    for a in archs:
        if a in SUPPORTED_ARCHITECTURES:  # noqa: F821 (the module's)
            arch = SUPPORTED_ARCHITECTURES[a]  # noqa: F821  the bug: no break, the last one wins
    if arch is None:
        raise ValueError(
            f"unsupported architectures {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"  # noqa: F821
        )
    rope = raw.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta") or raw.get("rope_theta") or 10000.0
    dtype_name = raw.get("dtype", raw.get("torch_dtype", "bfloat16")) or "bfloat16"
    num_heads = raw["num_attention_heads"]
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return cls(
        architecture=arch,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=raw.get("rms_norm_eps") or 1e-6,
        rope_theta=float(rope_theta),
        max_position_embeddings=raw.get("max_position_embeddings") or 4096,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        dtype=getattr(torch, str(dtype_name).replace("torch.", "")),
        eos_token_ids=eos_ids,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        rope_scaling=rope_scaling_from_hf(raw),  # noqa: F821
    )
