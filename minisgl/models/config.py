"""ModelConfig: the handful of numbers the engine needs from a Hugging Face `config.json`.

transformers 4 and 5 write some fields differently: the dtype is `torch_dtype` in 4 and `dtype` in 5;
RoPE's base is a top-level `rope_theta` in 4 and lives in `rope_parameters` in 5. Both are read here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict

import torch

SUPPORTED_ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "qwen3" or "llama"
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
    attention_bias: bool
    dtype: torch.dtype
    eos_token_id: int | None

    @classmethod
    def from_hf(cls, raw: Dict[str, Any]) -> "ModelConfig":
        """Build from the parsed `config.json` of either transformers layout.

        transformers 4 and 5 name a few fields differently (the dtype, RoPE's theta and its scaling
        type); both layouts of one model must give the same config. A field that would change the
        computation and is not supported is refused, never ignored.

        Receives: `raw`, the parsed config.json (a dict). Required: architectures, vocab_size,
            hidden_size, intermediate_size, num_hidden_layers, num_attention_heads; the rest may be
            absent or null (defaults: kv heads = query heads, head_dim = hidden_size // query heads,
            eps 1e-6, theta 10000, 4096 positions, untied, no attention bias, bfloat16, no EOS).
        Returns: a ModelConfig: architecture "qwen3" or "llama" (the first supported entry of
            architectures), dtype a torch.dtype, eos_token_id an int or None (the first of a list).
        Leaves: nothing changed (a pure function). Raises ValueError naming an unsupported
            architecture or a RoPE scaling type other than default.
        Uses: `SUPPORTED_ARCHITECTURES`, `ModelConfig` (ch03); only the standard library and torch
            otherwise.
        Checked: both layouts give the same config, and the test model's agrees with transformers';
            the defaults; head_dim's default; dtype and theta from either layout; Llama is
            recognized and the first supported architecture is used; unsupported architectures and
            RoPE scaling raise, while plain RoPE is accepted in every spelling.
        """
        archs = raw.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"unsupported architectures {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}")
        rope = raw.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        old_scaling = raw.get("rope_scaling") or {}  # transformers 4; older files say "type"
        scaling = rope.get("rope_type", old_scaling.get("rope_type", old_scaling.get("type", "default")))
        if scaling not in ("default", None):
            raise ValueError(f"RoPE scaling {scaling!r} is not supported")
        dtype_name = raw.get("dtype", raw.get("torch_dtype", "bfloat16")) or "bfloat16"
        num_heads = raw["num_attention_heads"]
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
            num_kv_heads=raw.get("num_key_value_heads", num_heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            dtype=getattr(torch, str(dtype_name).replace("torch.", "")),
            eos_token_id=eos,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {model_dir}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        return cls.from_hf(raw)
