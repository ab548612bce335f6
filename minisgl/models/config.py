"""ModelConfig: the handful of numbers the engine needs from a Hugging Face `config.json`.

transformers 4 and 5 write some fields differently: the dtype is `torch_dtype` in 4 and `dtype` in
5; RoPE's base is a top-level `rope_theta` in 4 and lives in `rope_parameters` in 5 (with the
scaling that 4 writes as `rope_scaling`). Both are read here.

Every field of the supported architectures' configs is in one of three lists below: the fields the
engine reads, the fields that would change the computation in a way the engine does not implement
(refused unless they hold a value that changes nothing), and the fields that do not change
inference. tests/test_checkpoints.py walks transformers' config classes and fails on a field in none
of them, so a new field in a new transformers release is a decision, not a silent difference.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}

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
)
# Would change the computation; accepted only with a value that makes them a no-op
# (check_supported).
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
    }
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
    if raw.get("quantization_config"):
        method = raw["quantization_config"]
        method = method.get("quant_method", method) if isinstance(method, dict) else method
        raise ValueError(
            f"quantization_config ({method!r}) is not supported: the engine loads float32, "
            "float16 and bfloat16 weights, not quantized ones"
        )
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
    ):
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            got = "missing" if name not in raw else f"{value!r}"
            raise ValueError(f"{name} must be a positive integer, got {got}")
    for name in ("num_key_value_heads", "head_dim"):
        value = raw.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be a positive integer or null, got {value!r}")
    for name in ("max_position_embeddings",):
        value = raw.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be a positive integer or null, got {value!r}")
    rope = raw.get("rope_parameters") or {}
    for name, value in (
        ("rms_norm_eps", raw.get("rms_norm_eps")),
        ("rope_theta", rope.get("rope_theta", raw.get("rope_theta"))),
    ):
        if value is not None and not _is_positive_number(value):
            raise ValueError(f"{name} must be a positive number or null, got {value!r}")
    for name in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
        value = raw.get(name)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{name} must be true, false or null, got {value!r}")
    heads, kv = (
        raw["num_attention_heads"],
        raw.get("num_key_value_heads") or raw["num_attention_heads"],
    )
    if heads % kv:
        raise ValueError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})"
        )
    act = raw.get("hidden_act", "silu")
    if act not in _SILU:
        raise ValueError(
            f"hidden_act={act!r} is not supported: the engine's MLP is SwiGLU with silu"
        )
    if raw.get("use_sliding_window"):
        raise ValueError(
            "use_sliding_window=true is not supported: every layer attends to the "
            "whole sequence (sliding-window attention is not implemented)"
        )
    layer_types = raw.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise ValueError(
            f"layer_types {other} are not supported: only 'full_attention' layers are implemented"
        )
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(
            f"partial_rotary_factor={partial!r} is not supported: RoPE rotates the whole head"
        )
    if (raw.get("pretraining_tp") or 1) != 1:
        raise ValueError(
            f"pretraining_tp={raw['pretraining_tp']!r} is not supported: "
            "each linear layer is computed in one piece (pretraining_tp 1)"
        )
    dtype = raw.get("dtype", raw.get("torch_dtype"))
    if dtype is not None and str(dtype).removeprefix("torch.") not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; supported: {', '.join(_DTYPES)}")
    _check_one_rope_scaling(raw)
    rope_scaling_from_hf(raw)
    eos = raw.get("eos_token_id")
    if eos is not None and not _is_id_or_ids(eos):
        raise ValueError(f"eos_token_id must be a token id, a list of them or null, got {eos!r}")


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


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "qwen3", "llama" or "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: (
        bool  # biases on q, k, v and o (Qwen2's q/k/v biases come with the architecture)
    )
    dtype: torch.dtype
    eos_token_ids: Tuple[int, ...] = ()  # generation stops after any of them; () for none
    mlp_bias: bool = False  # biases on gate, up and down (Llama's mlp_bias)
    rope_scaling: RopeScaling | None = None  # None: plain RoPE

    @classmethod
    def from_hf(cls, raw: Dict[str, Any]) -> "ModelConfig":
        """Build from the parsed `config.json` of either transformers layout.

        transformers 4 and 5 name a few fields differently (the dtype, RoPE's theta); both layouts
        of one model must give the same config. A field that would change the computation and is
        not supported is refused, never ignored.

        Receives: `raw`, the parsed config.json (a dict). Required: architectures, vocab_size,
            hidden_size, intermediate_size, num_hidden_layers, num_attention_heads; the rest may be
            absent or null (defaults: kv heads = query heads, head_dim = hidden_size // query heads,
            eps 1e-6, theta 10000, 4096 positions, untied, no attention or MLP bias, bfloat16, no
            EOS, plain RoPE).
        Returns: a ModelConfig: architecture "qwen3", "llama" or "qwen2" (the first supported entry
            of architectures), dtype a torch.dtype, eos_token_ids a tuple of every end id (one id
            gives a 1-tuple, none an empty one), rope_scaling from `rope_scaling_from_hf`.
        Leaves: nothing changed (a pure function). Raises ValueError naming an unsupported
            architecture (and, through `rope_scaling_from_hf`, an unsupported RoPE type).
        Uses: `SUPPORTED_ARCHITECTURES`, `rope_scaling_from_hf`, `ModelConfig` (ch03); only the
            standard library and torch otherwise.
        Checked: both layouts give the same config, and the test model's agrees with transformers';
            the defaults, null meaning the default; head_dim's default; dtype and theta from either
            layout; every id of an EOS list; Llama and Qwen2 are recognized and the first supported
            architecture is used; unsupported architectures and RoPE scaling raise, while plain RoPE
            is accepted in every spelling and llama3 scaling is read.
        """
        archs = raw.get("architectures") or []
        arch = next(
            (SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None
        )
        if arch is None:
            raise ValueError(
                f"unsupported architectures {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
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
            rope_scaling=rope_scaling_from_hf(raw),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        """The config of a model directory: config.json checked (`check_supported`) and read."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {model_dir}")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        try:
            check_supported(raw)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        return cls.from_hf(raw)
