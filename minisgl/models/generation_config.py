"""A model's own generation settings, from `generation_config.json` as transformers reads them.

Instruct checkpoints ship this file to say when a turn ends (Llama-3.x lists three end ids, Qwen3
two) and how they like to be sampled. The engine takes from it:

- `eos_token_id` (an id or a list): generation stops after any of them. It replaces config.json's
  list, as in transformers; without the file (or without the field) config.json's is used.
- `do_sample`, `temperature`, `top_k`, `top_p`, `max_new_tokens`: defaults for the SamplingParams
  fields a request leaves unset (`SamplingParams.fields_set`: the fields an OpenAI client sent, or
  `LLM.generate`'s keywords; a SamplingParams passed whole sets them all). `do_sample` false
  (transformers' default) means greedy; true takes temperature, top_k and top_p from the file, or
  1.0, no top-k and 1.0 where the file says nothing (transformers 5's defaults).

Everything else in the file (repetition_penalty, min_p, num_beams, ...) is ignored: the engine
has no such sampling. A request's own `ignore_eos` still runs it to max_tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Tuple

FILE = "generation_config.json"


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: Tuple[int, ...] | None = None  # None: the file names no end ids
    sampling: Dict[str, Any] = field(default_factory=dict)  # SamplingParams field -> default

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "GenerationDefaults":
        path = Path(model_dir) / FILE
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path} must hold a JSON object, got {type(raw).__name__}")
        try:
            return cls.from_hf(raw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None

    @classmethod
    def from_hf(cls, raw: Dict[str, Any]) -> "GenerationDefaults":
        eos = raw.get("eos_token_id")
        ids = None if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        if ids is not None and not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
        ):
            raise ValueError(f"eos_token_id must be a token id or a list of them, got {eos!r}")
        sampling: Dict[str, Any] = {}
        if "do_sample" in raw:
            if raw["do_sample"]:
                sampling["temperature"] = _number(raw, "temperature", 1.0)
                top_k = raw.get("top_k")
                sampling["top_k"] = -1 if top_k in (None, 0) else top_k
                sampling["top_p"] = _number(raw, "top_p", 1.0)
            else:
                sampling["temperature"] = 0.0
        if raw.get("max_new_tokens") is not None:
            sampling["max_tokens"] = raw["max_new_tokens"]
        # Refuse what SamplingParams would refuse, naming the file's field, before any request uses
        # it.
        from minisgl.core import SamplingParams

        SamplingParams(**sampling)
        return cls(eos_token_ids=ids, sampling=sampling)

    def end_token_ids(self, config_ids: Tuple[int, ...]) -> frozenset:
        """The ids that end generation: this file's list if it has one, else config.json's."""
        return frozenset(config_ids if self.eos_token_ids is None else self.eos_token_ids)


def _number(raw: Dict[str, Any], name: str, default: float) -> float:
    value = raw.get(name)
    return default if value is None else value
