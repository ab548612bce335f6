"""What the engine does with each field of a Hugging Face `config.json`: the fields it reads, the
ones it refuses (they would change the computation in a way it does not implement) and the ones
that do not change inference; and `check_supported`, which holds a config to them, table by table.

tests/test_checkpoints.py walks transformers' config classes and fails on a field in none of the
three lists, so a new field in a new transformers release is a decision, not a silent difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from .hybrid_config import (
    HYBRID_ARCHITECTURES,
    HYBRID_NO_EFFECT_FIELDS,
    HYBRID_READ_FIELDS,
    hybrid_from_hf,
    text_part,
)
from .moe_config import MOE_ARCHITECTURES, MOE_NO_EFFECT_FIELDS, MOE_READ_FIELDS, moe_from_hf

SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    # Llama's math with a sliding window: exact while the window covers the engine's context
    # length (minisgl/engine/context.py refuses it by name otherwise)
    "MistralForCausalLM": "llama",
    # Gated DeltaNet layers between gated full-attention ones (hybrid_config.py); Qwen3-Next's
    # sparse layers add a shared expert, Qwen3.5's MLPs are dense. Of the vision-language Qwen3.5
    # the engine runs the language model (text in, text out)
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
}
# Architectures whose `sliding_window` is on whenever it is set (Qwen2/3 also need
# use_sliding_window)
WINDOWED_ARCHITECTURES = ("MistralForCausalLM",)

# Read by ModelConfig.from_hf (or by the loader: the weights' names and shapes follow from them).
READ_FIELDS = frozenset(
    {
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "rope_parameters",
        "rope_scaling",
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "dtype",
        "torch_dtype",
        "eos_token_id",
    }
    | MOE_READ_FIELDS  # a mixture of experts' (moe_config.py)
    | HYBRID_READ_FIELDS  # Qwen3-Next's and Qwen3.5's (hybrid_config.py)
)
# Would change the computation; accepted only with a value that makes them a no-op
# (check_supported). The hybrid architectures read layer_types and partial_rotary_factor
# (hybrid_config.py), and refuse the values they do not implement there.
REFUSED_FIELDS = frozenset(
    {
        "hidden_act",
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "layer_types",
        "partial_rotary_factor",
        "pretraining_tp",
        "quantization_config",  # not in the config classes: a quantized checkpoint adds it
    }
)
# Change nothing at inference: identity, tokens the tokenizer handles, training-only settings
# (dropout, initialisation, tensor-parallel hints), what a forward pass returns, caching switches.
NO_EFFECT_FIELDS = frozenset(
    {
        "_name_or_path",
        "model_type",
        "transformers_version",
        "bos_token_id",
        "pad_token_id",
        "attention_dropout",
        "initializer_range",
        "use_cache",
        "chunk_size_feed_forward",
        "id2label",
        "label2id",
        "is_encoder_decoder",
        "output_attentions",
        "output_hidden_states",
        "problem_type",
        "return_dict",
        "base_model_tp_plan",
        "base_model_pp_plan",
        "base_model_ep_plan",
    }
    | MOE_NO_EFFECT_FIELDS
    | HYBRID_NO_EFFECT_FIELDS
)
ROPE_TYPES = ("default", "llama3")  # rope_type values the engine implements
_SILU = ("silu", "swish")  # transformers' names for the same activation
_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (`rope_type: "llama3"`): long wavelengths are slowed by
    `factor`, short ones kept, the band between interpolated (minisgl/layers/rotary.py)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def rope_scaling_from_hf(raw: Dict[str, Any]) -> RopeScaling | None:
    """The RoPE scaling of a config.json in either layout: None for plain RoPE, a RopeScaling for
    "llama3"; ValueError naming the type for anything else (linear, dynamic, yarn, longrope...)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(
            f"RoPE scaling {kind!r} (rope_type) is not supported; supported: "
            f"{', '.join(ROPE_TYPES)}"
        )
    try:
        scaling = RopeScaling(
            float(params["factor"]),
            float(params["low_freq_factor"]),
            float(params["high_freq_factor"]),
            int(params.get("original_max_position_embeddings") or raw["max_position_embeddings"]),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"rope_type 'llama3' needs factor, low_freq_factor and high_freq_factor: {e!r} "
            "is missing or not a number"
        ) from None
    if not (scaling.factor > 0 and scaling.high_freq_factor > scaling.low_freq_factor > 0):
        raise ValueError(
            f"rope_type 'llama3' needs factor > 0 and high_freq_factor > low_freq_factor > 0, "
            f"got {scaling}"
        )
    return scaling


def check_supported(raw: Dict[str, Any]) -> None:
    """Refuse a config.json the engine would run wrongly: ValueError naming the field.

    The engine's MLP is SwiGLU with SiLU, every layer attends to the whole sequence, RoPE rotates
    the whole head, and each linear layer is computed in one piece. A field that says otherwise is
    refused, never ignored (ignoring it gives plausible but wrong tokens)."""
    if not isinstance(raw, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(raw).__name__}")
    archs = raw.get("architectures")
    if not archs or not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        got = "missing" if "architectures" not in raw else repr(archs)
        raise ValueError(
            f"architectures must be a list of model class names, got {got} (model_type "
            f"{raw.get('model_type')!r}); the engine picks the model from it, one of "
            f"{sorted(SUPPORTED_ARCHITECTURES)}"
        )
    # The model decides what every other field means: an unknown one is named before any field
    # (a GPT-2 config has n_embd, not hidden_size; "hidden_size missing" would mislead).
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ValueError(
            f"unsupported architectures {archs!r} (model_type {raw.get('model_type')!r}); "
            f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    raw = text_part(raw)  # a vision-language Qwen3.5: its language model's fields
    first = next(SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES)
    hybrid = first in HYBRID_ARCHITECTURES
    if raw.get("quantization_config"):
        method = raw["quantization_config"]
        method = method.get("quant_method", method) if isinstance(method, dict) else method
        raise ValueError(
            f"quantization_config ({method!r}) is not supported: the engine loads float32, "
            "float16 and bfloat16 weights, not quantized ones"
        )
    for name, what, ok, required in _FIELD_RULES:
        value = _field(raw, name)
        if (value is None and required) or (value is not None and not ok(value)):
            got = "missing" if value is None and name not in raw else f"{value!r}"
            raise ValueError(f"{name} must be {what}, got {got}")
    heads, kv = (
        raw["num_attention_heads"],
        raw.get("num_key_value_heads") or raw["num_attention_heads"],
    )
    if heads % kv:
        raise ValueError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})"
        )
    for refused, why in _UNSUPPORTED:
        if hybrid and refused in _HYBRID_READS:
            continue  # hybrid_from_hf reads and checks these
        if refused(raw):
            raise ValueError(why(raw))
    dtype = raw.get("dtype", raw.get("torch_dtype"))
    if dtype is not None and str(dtype).removeprefix("torch.") not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; supported: {', '.join(_DTYPES)}")
    _check_one_rope_scaling(raw)
    rope_scaling_from_hf(raw)
    eos = raw.get("eos_token_id")
    if eos is not None and not _is_id_or_ids(eos):
        raise ValueError(f"eos_token_id must be a token id, a list of them or null, got {eos!r}")
    if first in MOE_ARCHITECTURES:
        moe_from_hf(raw)  # the experts' fields, checked
    if hybrid:
        hybrid_from_hf(raw, first)


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _field(raw: Dict[str, Any], name: str) -> Any:
    if name == "rope_theta":  # transformers 5 keeps it in rope_parameters
        return (raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta"))
    return raw.get(name)


# The fields whose type and range check_supported holds, in the order it checks them:
# (field, what it must be, the check, whether it must be present).
_FIELD_RULES: Tuple[Tuple[str, str, Callable[[Any], bool], bool], ...] = (
    *((n, "a positive integer", _positive_int, True) for n in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads",
    )),
    *((n, "a positive integer or null", _positive_int, False) for n in (
        "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
    )),
    *((n, "a positive number or null", lambda v: _is_positive_number(v), False) for n in (
        "rms_norm_eps", "rope_theta",
    )),
    *((n, "true, false or null", lambda v: isinstance(v, bool), False) for n in (
        "tie_word_embeddings", "attention_bias", "mlp_bias",
    )),
)  # fmt: skip


def _rope_params(raw: Dict[str, Any]) -> Dict[str, Any]:
    return raw.get("rope_parameters") or raw.get("rope_scaling") or {}


def _partial_rotary(raw: Dict[str, Any]) -> Any:
    return _rope_params(raw).get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))


def _other_layer_types(raw: Dict[str, Any]) -> List[str]:
    return sorted({t for t in raw.get("layer_types") or [] if t != "full_attention"})


def _has_other_layer_types(raw: Dict[str, Any]) -> bool:
    return bool(_other_layer_types(raw))


def _has_partial_rotary(raw: Dict[str, Any]) -> bool:
    return _partial_rotary(raw) not in (None, 1, 1.0)


# What the engine does not implement, refused in this order: (is it asked for?, why not).
_UNSUPPORTED: Tuple[Tuple[Callable[[Dict], bool], Callable[[Dict], str]], ...] = (
    (
        lambda raw: raw.get("hidden_act", "silu") not in _SILU,
        lambda raw: (
            f"hidden_act={raw['hidden_act']!r} is not supported: the engine's MLP is "
            "SwiGLU with silu"
        ),
    ),
    (
        lambda raw: bool(raw.get("use_sliding_window")),
        lambda raw: (
            "use_sliding_window=true is not supported: every layer attends to the whole "
            "sequence (sliding-window attention is not implemented)"
        ),
    ),
    (
        _has_other_layer_types,
        lambda raw: (
            f"layer_types {_other_layer_types(raw)} are not supported: only "
            "'full_attention' layers are implemented"
        ),
    ),
    (
        _has_partial_rotary,
        lambda raw: (
            f"partial_rotary_factor={_partial_rotary(raw)!r} is not supported: RoPE "
            "rotates the whole head"
        ),
    ),
    (
        lambda raw: (raw.get("pretraining_tp") or 1) != 1,
        lambda raw: (
            f"pretraining_tp={raw['pretraining_tp']!r} is not supported: each linear "
            "layer is computed in one piece (pretraining_tp 1)"
        ),
    ),
)


# refused for the other architectures, read by the hybrid ones (hybrid_config.py)
_HYBRID_READS = (_has_other_layer_types, _has_partial_rotary)


def _check_one_rope_scaling(raw: Dict[str, Any]) -> None:
    """transformers 5 writes RoPE scaling in rope_parameters, 4 in rope_scaling; the engine reads
    rope_parameters when present. A file with both must not say two different things there."""
    kinds = {}
    for name in ("rope_parameters", "rope_scaling"):
        params = raw.get(name)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise ValueError(f"{name} must be an object or null, got {params!r}")
        kinds[name] = params.get("rope_type", params.get("type", "default")) or "default"
    if len(set(kinds.values())) > 1:
        raise ValueError(
            f"rope_parameters and rope_scaling disagree (rope_type {kinds['rope_parameters']!r} "
            f"vs {kinds['rope_scaling']!r}): keep one of them"
        )


def _is_positive_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _is_id_or_ids(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items)
