"""`from_hf` whose default `head_dim` divides the hidden size by the KV heads instead of the query heads.

Right for plain multi-head attention (as many KV heads as query heads), wrong with grouped-query
attention: a Llama config without `head_dim`, 8 query heads and 2 KV heads of a 128-wide hidden
state has heads of 16 dimensions, not 64, and the model's projections get the wrong shapes.
"""


def from_hf(cls, raw):
    archs = raw.get("architectures") or []
    arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architectures {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    rope = raw.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    old_scaling = raw.get("rope_scaling") or {}
    scaling = rope.get("rope_type", old_scaling.get("rope_type", old_scaling.get("type", "default")))
    if scaling not in ("default", None):
        raise ValueError(f"RoPE scaling {scaling!r} is not supported")
    dtype_name = raw.get("dtype", raw.get("torch_dtype", "bfloat16")) or "bfloat16"
    num_heads = raw["num_attention_heads"]
    num_kv_heads = raw.get("num_key_value_heads", num_heads)
    eos = raw.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    return cls(
        architecture=arch,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_kv_heads,  # the bug: // num_heads
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        dtype=getattr(torch, str(dtype_name).replace("torch.", "")),
        eos_token_id=eos,
    )
