"""Per-expert weights stacked into the engine's expert tensors, as the checkpoint streams by.

transformers 4 (and the Qwen3-MoE checkpoints on the Hub) store each expert's projections apart:
`...mlp.experts.{e}.gate_proj.weight` [inter, hidden], `up_proj` and `down_proj` [hidden, inter].
The engine keeps them stacked as transformers 5 does in memory, and as it writes with
`save_pretrained(save_original_format=False)`: `...mlp.experts.gate_up_proj` [experts, 2 * inter,
hidden] (each expert's gate rows, then its up rows) and `...mlp.experts.down_proj` [experts, hidden,
inter]. Stacked tensors in the file pass through unchanged.

A layer's stacked tensors are yielded as soon as its last expert's part has arrived, so at most
the layers being read are held twice.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Iterator, Tuple

import torch

_PART = re.compile(r"^(?P<base>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")
_STACKED = {"gate": "gate_up_proj", "up": "gate_up_proj", "down": "down_proj"}
_PARTS_PER_EXPERT = {"gate_up_proj": ("gate", "up"), "down_proj": ("down",)}


def expert_count(model_dir: str | Path) -> int:
    """The number of experts config.json declares (num_experts or num_local_experts), 0 if none."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(raw, dict):
        return 0
    count = raw.get("num_experts", raw.get("num_local_experts"))
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def stack_experts(
    tensors: Iterator[Tuple[str, torch.Tensor]], num_experts: int
) -> Iterator[Tuple[str, torch.Tensor]]:
    """`tensors` with every per-expert projection replaced by the stacked tensors it belongs to.

    Raises ValueError naming the weight for an expert index outside [0, num_experts), a part seen
    twice, or experts whose shapes differ; KeyError naming the first missing part when the stream
    ends with a stacked tensor incomplete."""
    pending: Dict[str, Dict[Tuple[int, str], torch.Tensor]] = {}
    for key, tensor in tensors:
        m = _PART.match(key)
        if m is None or num_experts == 0:
            yield key, tensor
            continue
        expert, proj = int(m["e"]), m["proj"]
        if expert >= num_experts:
            raise ValueError(
                f"weight {key}: expert {expert} does not exist (config.json declares "
                f"{num_experts} experts)"
            )
        stacked = f"{m['base']}.{_STACKED[proj]}"
        parts = pending.setdefault(stacked, {})
        if (expert, proj) in parts:
            raise ValueError(f"weight {key} appears twice in the checkpoint")
        parts[(expert, proj)] = tensor
        names = _PARTS_PER_EXPERT[_STACKED[proj]]
        if len(parts) == num_experts * len(names):
            yield stacked, _stack(stacked, parts, num_experts, names)
            del pending[stacked]
    for stacked, parts in pending.items():
        names = _PARTS_PER_EXPERT[stacked.rsplit(".", 1)[1]]
        missing = next((e, n) for e in range(num_experts) for n in names if (e, n) not in parts)
        base = stacked.rsplit(".", 1)[0]
        raise KeyError(
            f"missing weight: {base}.{missing[0]}.{missing[1]}_proj.weight (part of {stacked}: "
            f"{len(parts)} of {num_experts * len(names)} expert weights found)"
        )


def _stack(
    stacked: str,
    parts: Dict[Tuple[int, str], torch.Tensor],
    num_experts: int,
    names: Tuple[str, ...],
) -> torch.Tensor:
    shapes = {(n, tuple(t.shape)) for (_, n), t in parts.items()}
    if len(shapes) > len(names):
        raise ValueError(
            f"the experts of {stacked} differ in shape: {sorted(shapes)} (one per projection "
            "expected)"
        )
    per_expert = [torch.cat([parts[(e, n)] for n in names], dim=0) for e in range(num_experts)]
    return torch.stack(per_expert)
