"""ModelConfig: the handful of numbers the engine needs from a Hugging Face `config.json`.

transformers 4 and 5 write some fields differently: the dtype is `torch_dtype` in 4 and `dtype` in
5; RoPE's base is a top-level `rope_theta` in 4 and lives in `rope_parameters` in 5 (with the
scaling that 4 writes as `rope_scaling`). Both are read here.

Every field of the supported architectures' configs is in one of three lists of config_rules.py:
the fields the engine reads, the fields that would change the computation in a way the engine does
not implement (refused unless they hold a value that changes nothing), and the fields that do not
change inference; `check_supported` there refuses a config the engine would run wrongly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

from .config_rules import (  # noqa: F401  (re-exported: the field lists, for tests and chapter 3)
    NO_EFFECT_FIELDS,
    READ_FIELDS,
    REFUSED_FIELDS,
    ROPE_TYPES,
    SUPPORTED_ARCHITECTURES,
    WINDOWED_ARCHITECTURES,
    RopeScaling,
    check_supported,
    rope_scaling_from_hf,
)
from .hybrid_config import HYBRID_ARCHITECTURES, HybridConfig, hybrid_from_hf, text_part
from .moe_config import MOE_ARCHITECTURES, MoeConfig, moe_from_hf


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "qwen3", "llama", "qwen2", "qwen3_moe", "qwen3_next" or "qwen3_5"
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
    moe: MoeConfig | None = None  # the experts of a mixture-of-experts model; None: dense
    # Mistral's attention window (tokens), None for none; set by from_dir. A token sees itself and
    # the window - 1 before it: all of a sequence no longer than the window, so the engine runs it
    # only with a context length <= the window (minisgl/engine/context.py)
    sliding_window: int | None = None
    # Qwen3-Next's and Qwen3.5's layer kinds, DeltaNet heads and partial RoPE (hybrid_config.py);
    # None: every layer full attention
    hybrid: HybridConfig | None = None

    @property
    def num_kv_layers(self) -> int:
        """The layers that keep KV in the cache: all of them, or a hybrid's full-attention ones."""
        return self.num_layers if self.hybrid is None else len(self.hybrid.full_layers)

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
        raw = text_part(raw)  # a vision-language Qwen3.5: its language model's fields
        config = cls.with_experts(cls.from_hf(raw), raw)
        if config.architecture in HYBRID_ARCHITECTURES:
            config = replace(config, hybrid=hybrid_from_hf(raw, config.architecture))
        arch = next(a for a in raw["architectures"] if a in SUPPORTED_ARCHITECTURES)
        if arch in WINDOWED_ARCHITECTURES and raw.get("sliding_window") is not None:
            config = replace(config, sliding_window=raw["sliding_window"])
        return config

    @staticmethod
    def with_experts(cfg: "ModelConfig", raw: Dict[str, Any]) -> "ModelConfig":
        """`cfg` with the experts of a mixture-of-experts config.json added (`moe_from_hf`);
        a dense model's unchanged. Kept apart from from_hf, which reads what every decoder has."""
        if cfg.architecture not in MOE_ARCHITECTURES:
            return cfg
        return replace(cfg, moe=moe_from_hf(raw))
