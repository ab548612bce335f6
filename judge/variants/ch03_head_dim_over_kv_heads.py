"""`from_hf` whose default `head_dim` divides the hidden size by the KV heads instead of the query
heads.

Right for plain multi-head attention (as many KV heads as query heads), wrong with grouped-query
attention: a Llama config without `head_dim`, 8 query heads and 2 KV heads of a 128-wide hidden
state has heads of 16 dimensions, not 64, and the model's projections get the wrong shapes.
"""


def from_hf(cls, raw):
    archs = raw.get("architectures") or []
    arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(
            f"unsupported architectures {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    rope = raw.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta") or raw.get("rope_theta") or 10000.0
    dtype_name = raw.get("dtype", raw.get("torch_dtype", "bfloat16")) or "bfloat16"
    num_heads = raw["num_attention_heads"]
    num_kv_heads = raw.get("num_key_value_heads") or num_heads
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return cls(
        architecture=arch,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_kv_heads,  # the bug: // num_heads
        rms_norm_eps=raw.get("rms_norm_eps") or 1e-6,
        rope_theta=float(rope_theta),
        max_position_embeddings=raw.get("max_position_embeddings") or 4096,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        dtype=getattr(torch, str(dtype_name).replace("torch.", "")),
        eos_token_ids=eos_ids,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        rope_scaling=rope_scaling_from_hf(raw),
    )
