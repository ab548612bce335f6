"""What a model allows a request, resolved once from its directory: the context length, the
vocabulary, the ids that end generation and the sampling defaults of generation_config.json.

The engine resolves them when it loads the model (`Engine.limits`); the scheduler's intake checks
and defaults every request by them (minisgl/scheduler/lifecycle.py); the server's tokenizer worker
gets the same object (minisgl/server/processes.py) instead of working them out again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, FrozenSet

from .config import ModelConfig
from .generation_config import GenerationDefaults


@dataclass(frozen=True)
class ModelLimits:
    context_len: int  # prompt + generated tokens of one request, at most
    vocab_size: int
    end_token_ids: FrozenSet[int]  # any of them ends a request (empty: the model has none)
    sampling_defaults: Dict[str, Any] = field(default_factory=dict)  # SamplingParams field -> value

    @classmethod
    def resolve(
        cls, model_dir: str | Path, config: ModelConfig, max_seq_len_override: int | None = None
    ) -> "ModelLimits":
        """The limits of the model in `model_dir` (whose config.json is `config`), with the
        engine's `max_seq_len_override` if one is set (it may shorten the context, never lengthen
        it: RoPE's tables and the attention kernels stop at the model's limit)."""
        if (
            max_seq_len_override is not None
            and max_seq_len_override > config.max_position_embeddings
        ):
            raise ValueError(
                f"max_seq_len_override={max_seq_len_override} exceeds the model's "
                f"max_position_embeddings ({config.max_position_embeddings})"
            )
        # generation_config.json's end ids replace config.json's, as in transformers
        generation = GenerationDefaults.from_dir(model_dir)
        return cls(
            context_len=max_seq_len_override or config.max_position_embeddings,
            vocab_size=config.vocab_size,
            end_token_ids=generation.end_token_ids(config.eos_token_ids),
            sampling_defaults=dict(generation.sampling),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path, max_seq_len_override: int | None = None):
        return cls.resolve(model_dir, ModelConfig.from_dir(model_dir), max_seq_len_override)
