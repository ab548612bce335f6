"""Streaming weight loading from safetensors files in Hugging Face layout.

Tensors are read one at a time (never the whole checkpoint at once), renamed to the engine's keys,
and q/k/v and gate/up projections are concatenated into the merged weights the engine uses.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, Tuple

import torch

from minisgl.layers import BaseOP

from .expert_weights import expert_count, stack_experts

if TYPE_CHECKING:
    from .sharding import Shard

# HF suffix -> (merged engine suffix, position of this part in the merged weight, parts in total)
_MERGES = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0, 3),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1, 3),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2, 3),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0, 2),
    "mlp.up_proj": ("mlp.gate_up_proj", 1, 2),
}


def safetensors_files(model_dir: str | Path) -> List[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / n for n in names]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth"))
        hint = (
            f" ({', '.join(others)} found: the engine reads only safetensors; load it with "
            "transformers and save_pretrained it to get *.safetensors)"
            if others
            else ""
        )
        raise FileNotFoundError(f"no *.safetensors files in model directory {model_dir}{hint}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint file(s) listed but missing: {', '.join(missing)}")
    return files


# The tensor-parallel rank whose slices `_file_tensors` reads (sharding.py), None for whole tensors.
# Set around a call of load_weight by `reading_shard`, so load_weight (chapter 3's exercise) stays
# the one-rank function a learner writes, and a rank still reads only its own bytes.
_SHARD: ContextVar["Shard | None"] = ContextVar("shard", default=None)


@contextmanager
def reading_shard(shard: "Shard") -> Iterator[None]:
    token = _SHARD.set(shard)
    try:
        yield
    finally:
        _SHARD.reset(token)


def iter_hf_tensors(model_dir: str | Path) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the checkpoint, one at a time, a mixture of experts' per-expert
    projections stacked into the engine's expert tensors (expert_weights.py)."""
    return stack_experts(_file_tensors(model_dir), expert_count(model_dir))


# Weights of parts the engine does not run: a vision-language Qwen3.5's vision encoder, and the
# multi-token-prediction head Qwen3-Next and Qwen3.5 ship for speculative decoding
_SKIPPED_PREFIXES = ("model.visual.", "mtp.")
_LANGUAGE_MODEL = "model.language_model."  # Qwen3_5ForConditionalGeneration's text decoder


def _language_model(
    tensors: Iterator[Tuple[str, torch.Tensor]],
) -> Iterator[Tuple[str, torch.Tensor]]:
    """The tensors of the text decoder under the keys a text-only model has."""
    for key, tensor in tensors:
        if key.startswith(_SKIPPED_PREFIXES):
            continue
        if key.startswith(_LANGUAGE_MODEL):
            key = "model." + key[len(_LANGUAGE_MODEL) :]
        yield key, tensor


def _file_tensors(model_dir: str | Path) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the checkpoint's files that the engine runs (`_language_model`)."""
    return _language_model(_all_file_tensors(model_dir))


def _all_file_tensors(model_dir: str | Path) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the checkpoint's files. A name in two files is an error: with no
    index to say which copy is meant, keeping either one could load the wrong weights."""
    from safetensors import safe_open

    seen: Dict[str, Path] = {}
    shard = _SHARD.get()
    for path in safetensors_files(model_dir):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                keys = list(f.keys())
        except Exception as e:  # safetensors raises its own error types for a corrupt file
            raise ValueError(f"cannot read checkpoint file {path}: {e}") from None
        for key in keys:
            if key in seen:
                raise ValueError(
                    f"weight {key} is in both {seen[key].name} and {path.name}: a checkpoint "
                    "in several "
                    "*.safetensors files must split its weights between them (or name the file "
                    "of each "
                    "in model.safetensors.index.json)"
                )
            seen[key] = path
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in keys:
                try:
                    if shard is None:
                        tensor = f.get_tensor(key)
                    else:  # only this rank's slice is read from the file
                        tensor = shard.read(key, f.get_slice(key))
                except Exception as e:
                    raise ValueError(f"cannot read checkpoint file {path}: {e}") from None
                check_weight_values(key, tensor, path)
                yield key, tensor


_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_weight_values(key: str, tensor: torch.Tensor, path: Path) -> None:
    """Refuse a weight the engine would compute garbage from, naming it: integer or 8-bit data
    (a quantized or broken file, which a cast to the model's dtype would silently turn into
    numbers) and NaN or infinity (every token after it would be NaN, sampled as token 0)."""
    if tensor.dtype not in _WEIGHT_DTYPES:
        raise ValueError(
            f"weight {key} in {path.name} is {str(tensor.dtype).removeprefix('torch.')}: the "
            "engine loads float32, float16 and bfloat16 weights (is the checkpoint quantized?)"
        )
    if not torch.isfinite(tensor).all():
        bad = int((~torch.isfinite(tensor)).sum())
        raise ValueError(
            f"weight {key} in {path.name} holds {bad} NaN or infinite value(s) of "
            f"{tensor.numel()}: the checkpoint is broken"
        )


def check_cast_values(state: Dict[str, torch.Tensor], chunk: int = 1 << 24) -> None:
    """Refuse a weight whose cast to the model's dtype overflowed, naming it and the dtype: a
    bfloat16 or float32 checkpoint holds values beyond float16's 65504, which the cast made
    infinite (the model would then compute NaN and sample token 0 again and again). The checkpoint
    itself was checked finite (`check_weight_values`), so an infinity now is the cast's. Only
    float16 has a narrower range than the checkpoints' dtypes; it is checked `chunk` elements at a
    time, so the check never needs much memory beside the weight."""
    for key, tensor in state.items():
        if tensor.dtype != torch.float16:
            continue
        flat = tensor.reshape(-1)
        bad = sum(int((~torch.isfinite(part)).sum()) for part in flat.split(chunk))
        if bad:
            raise ValueError(
                f"weight {key} does not fit float16: {bad} of its {tensor.numel()} values are "
                "beyond float16's range (65504) and became infinite; load the model with "
                "dtype bfloat16 or float32"
            )


def load_weight(
    model: BaseOP, model_dir: str | Path, device: torch.device
) -> Dict[str, torch.Tensor]:
    """Load the checkpoint in `model_dir` into `model`, merging split projections.

    Hugging Face stores q/k/v and gate/up projections as separate tensors; the engine uses one
    merged qkv_proj and one gate_up_proj (parts concatenated along dim 0, in that order). Tensors
    are read one at a time, never the whole checkpoint at once. Every mismatch between checkpoint
    and model is an error that names the key.

    Receives: `model`, an op whose `named_tensors()` gives its keys, shapes and dtypes; `model_dir`,
        a directory of *.safetensors files (one or sharded, with an index); `device`.
    Returns: the state dict loaded, keyed exactly like the model's tensors, each on `device` in the
        model's dtype.
    Leaves: every weight of `model` replaced (strictly: no key missing, extra or mis-shaped).
        `rotary_emb.inv_freq` and, for a tied model, `lm_head.weight` are skipped. Raises KeyError
        for a missing, extra or incomplete merged weight, ValueError for a wrong shape or a part
        seen twice or an unreadable file, FileNotFoundError when there is no checkpoint file.
    Uses: `iter_hf_tensors`, `_MERGES` (ch03); `model.named_tensors` (ch02), `model.load_state_dict`
        (ch02).
    Checked: exactly the model's keys, with merges (biases too); the loaded Qwen3 and a Llama match
        Hugging Face's logits; a sharded checkpoint loads the same; each kind of bad checkpoint is
        named; weights land on the device in the model's dtype.
    """
    expected = {k: v for k, v in model.named_tensors()}
    state: Dict[str, torch.Tensor] = {}
    pending: Dict[str, List[torch.Tensor | None]] = {}  # merged key -> parts seen so far
    for key, tensor in iter_hf_tensors(model_dir):
        if key.endswith("rotary_emb.inv_freq"):
            continue  # a cache some old checkpoints saved; recomputed from the config
        if key == "lm_head.weight" and key not in expected:
            continue  # a tied model may still ship a copy of the embedding as its head
        merged = None
        for hf_suffix, (engine_suffix, pos, total) in _MERGES.items():
            if key.endswith(hf_suffix + ".weight") or key.endswith(hf_suffix + ".bias"):
                kind = key.rsplit(".", 1)[1]
                base = key[: -len(hf_suffix + "." + kind)]
                merged = (f"{base}{engine_suffix}.{kind}", pos, total)
                break
        if merged is None:
            target = expected.get(key)
            state[key] = tensor.to(
                device=device, dtype=target.dtype if target is not None else tensor.dtype
            )
            continue
        mkey, pos, total = merged
        parts = pending.setdefault(mkey, [None] * total)
        if parts[pos] is not None:
            raise ValueError(f"weight {key} appears twice in the checkpoint")
        parts[pos] = tensor
        if all(p is not None for p in parts):
            target = expected.get(mkey)
            dtype = target.dtype if target is not None else tensor.dtype
            if (
                len({tuple(p.shape[1:]) for p in parts}) > 1
            ):  # torch.cat's own error names no weight
                raise ValueError(
                    f"the parts of {mkey} do not fit together (is one transposed?): shapes "
                    f"{[tuple(p.shape) for p in parts]}, in the order q, k, v or gate, up"
                )
            state[mkey] = torch.cat([p.to(device=device, dtype=dtype) for p in parts], dim=0)
            del pending[mkey]
    if pending:
        mkey, parts = next(iter(pending.items()))
        raise KeyError(
            f"missing weight: {mkey} needs {len(parts)} parts, found "
            f"{sum(p is not None for p in parts)}"
        )
    model.load_state_dict(state)
    return state
