"""The hybrid part of a Qwen3-Next or Qwen3.5 `config.json`: which layers are Gated DeltaNet
("linear_attention") and which full attention, the DeltaNet layers' heads and convolution, the
share of each attention head that RoPE rotates, and Qwen3-Next's shared expert.

What the two families have beyond Qwen3, each read here or fixed by the architecture:
- `layer_types`: "linear_attention" or "full_attention" per layer (nothing else is implemented);
- a DeltaNet layer: `linear_num_key_heads` query/key heads of `linear_key_head_dim`,
  `linear_num_value_heads` value heads of `linear_value_head_dim` (a multiple of the key heads:
  each key head serves a run of value heads), a causal convolution `linear_conv_kernel_dim` wide;
- full attention: RoPE on the first `partial_rotary_factor * head_dim` dimensions of each head, a
  sigmoid output gate (q_proj is twice as tall: each head's query, then its gate);
- every RMSNorm but the DeltaNet output's scales by (1 + weight) (the loader adds the 1 once);
- Qwen3-Next's sparse layers add a shared expert, `shared_expert_intermediate_size` wide, behind a
  sigmoid gate.

A Qwen3.5 model with vision (`Qwen3_5ForConditionalGeneration`) keeps these fields in its
`text_config`; `text_part` lifts them to the top, so the rest of the engine reads one layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

HYBRID_READ_FIELDS = frozenset(
    {
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "shared_expert_intermediate_size",
        "full_attention_interval",  # Qwen3-Next without layer_types: every n-th layer full
        "text_config",  # Qwen3_5ForConditionalGeneration: the language model's fields
    }
)
# Qwen3_5ForConditionalGeneration's vision side: the engine runs text only, and a text prompt never
# holds the image tokens
HYBRID_NO_EFFECT_FIELDS = frozenset(
    {
        "vision_config",
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
    }
)
HYBRID_ARCHITECTURES = frozenset({"qwen3_next", "qwen3_5"})
LAYER_KINDS = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class HybridConfig:
    layer_types: Tuple[str, ...]  # per layer: "linear_attention" or "full_attention"
    linear_k_heads: int
    linear_v_heads: int
    linear_k_dim: int
    linear_v_dim: int
    conv_kernel: int
    rotary_dim: int  # dimensions of each attention head RoPE rotates (the first ones)
    shared_expert_size: int = 0  # Qwen3-Next's shared expert; 0: none

    @property
    def full_layers(self) -> Tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def linear_layers(self) -> Tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def conv_channels(self) -> int:
        """Channels of the convolution: query, key and value side by side."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim


def text_part(raw: Dict[str, Any]) -> Dict[str, Any]:
    """`raw` with a nested `text_config` lifted to the top (its architectures kept), else `raw`."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return raw
    lifted = {k: v for k, v in raw.items() if k != "text_config"}
    lifted.update(text)
    lifted["architectures"] = raw.get("architectures")
    if "tie_word_embeddings" in raw:  # Qwen3.5 keeps it at the top
        lifted["tie_word_embeddings"] = raw["tie_word_embeddings"]
    return lifted


def _positive(raw: Dict[str, Any], name: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        got = "missing" if name not in raw else repr(value)
        raise ValueError(f"{name} must be a positive integer, got {got}")
    return value


def hybrid_from_hf(raw: Dict[str, Any], architecture: str) -> HybridConfig:
    """The hybrid settings of a Qwen3-Next or Qwen3.5 config.json (text part), checked: ValueError
    naming a field that is missing, of the wrong type or out of range."""
    layers = _positive(raw, "num_hidden_layers")
    types = raw.get("layer_types")
    if types is None:  # transformers' default: every n-th layer full attention
        every = raw.get("full_attention_interval") or 4
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"full_attention_interval must be a positive integer, got {every!r}")
        types = [
            "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)
        ]
    if not isinstance(types, list) or len(types) != layers:
        raise ValueError(f"layer_types must list one kind per layer ({layers}), got {types!r}")
    unknown = sorted({t for t in types if t not in LAYER_KINDS})
    if unknown:
        raise ValueError(
            f"layer_types {unknown} are not supported: a hybrid model's layers are "
            f"{' or '.join(LAYER_KINDS)}"
        )
    if "full_attention" not in types:
        raise ValueError(
            "layer_types has no 'full_attention' layer: a model of DeltaNet layers alone is not "
            "supported (transformers' cache cannot run one either)"
        )
    k_heads, v_heads = (
        _positive(raw, "linear_num_key_heads"),
        _positive(raw, "linear_num_value_heads"),
    )
    if v_heads % k_heads:
        raise ValueError(
            f"linear_num_value_heads ({v_heads}) must be a multiple of linear_num_key_heads "
            f"({k_heads}): each key head serves a run of value heads"
        )
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    factor = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"partial_rotary_factor must be a number in (0, 1], got {factor!r}")
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"partial_rotary_factor={factor} rotates {rotary_dim} of head_dim {head_dim}: RoPE "
            "needs an even number of dimensions, at least 2"
        )
    shared = 0
    if architecture == "qwen3_next":
        shared = raw.get("shared_expert_intermediate_size") or 0
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ValueError(
                f"shared_expert_intermediate_size must be an integer >= 0, got {shared!r}"
            )
    return HybridConfig(
        layer_types=tuple(types),
        linear_k_heads=k_heads,
        linear_v_heads=v_heads,
        linear_k_dim=_positive(raw, "linear_key_head_dim"),
        linear_v_dim=_positive(raw, "linear_value_head_dim"),
        conv_kernel=_positive(raw, "linear_conv_kernel_dim"),
        rotary_dim=rotary_dim,
        shared_expert_size=shared,
    )
