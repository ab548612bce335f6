"""The mixture-of-experts part of a Qwen3-MoE `config.json`: how many experts, how many each token
visits, how wide each one is, whether the chosen experts' weights are renormalised, and which
layers are sparse.

transformers 4 writes the expert count as `num_experts`; transformers 5 writes it as
`num_local_experts` (its config maps one name to the other). Both are read; a file with both must
give the same number.

A layer is sparse (a router and experts instead of the dense SwiGLU MLP) exactly when transformers
makes it one: its index is not in `mlp_only_layers`, there is at least one expert, and
`(index + 1) % decoder_sparse_step == 0`. The dense layers use `intermediate_size`; the experts use
`moe_intermediate_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

# Read by moe_from_hf (and by the loader: the experts' weights follow from them).
MOE_READ_FIELDS = frozenset(
    {
        "num_experts",
        "num_local_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "decoder_sparse_step",
        "mlp_only_layers",
    }
)
# Training only: the router's load-balancing loss and whether forward returns the router's logits.
MOE_NO_EFFECT_FIELDS = frozenset({"output_router_logits", "router_aux_loss_coef"})
MOE_ARCHITECTURES = frozenset({"qwen3_moe", "qwen3_next"})


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int  # experts each token is sent to (num_experts_per_tok)
    intermediate_size: int  # of one expert (moe_intermediate_size)
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1
    sparse_layers: Tuple[int, ...]  # the layers with a router and experts; the rest are dense


def _positive_int(raw: Dict[str, Any], name: str, minimum: int = 1) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        got = "missing" if name not in raw else repr(value)
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {got}")
    return value


def _num_experts(raw: Dict[str, Any]) -> int:
    names = [n for n in ("num_experts", "num_local_experts") if raw.get(n) is not None]
    if not names:
        raise ValueError("num_experts (or num_local_experts) must be an integer >= 0, got missing")
    values = {n: _positive_int(raw, n, minimum=0) for n in names}
    if len(set(values.values())) > 1:
        raise ValueError(
            f"num_experts ({values['num_experts']}) and num_local_experts "
            f"({values['num_local_experts']}) disagree: keep one of them"
        )
    return next(iter(values.values()))


def moe_from_hf(raw: Dict[str, Any]) -> MoeConfig:
    """The MoE settings of a Qwen3-MoE config.json, checked: ValueError naming a field that is
    missing, of the wrong type or out of range (top-k above the expert count, a layer index in
    mlp_only_layers that is not a layer, decoder_sparse_step 0)."""
    layers = _positive_int(raw, "num_hidden_layers")
    experts = _num_experts(raw)
    top_k = _positive_int(raw, "num_experts_per_tok")
    if experts and top_k > experts:
        raise ValueError(
            f"num_experts_per_tok ({top_k}) must not exceed the number of experts ({experts})"
        )
    width = _positive_int(raw, "moe_intermediate_size")
    norm = raw.get("norm_topk_prob")
    if norm is not None and not isinstance(norm, bool):
        raise ValueError(f"norm_topk_prob must be true, false or null, got {norm!r}")
    step = (
        1 if raw.get("decoder_sparse_step") is None else _positive_int(raw, "decoder_sparse_step")
    )
    dense = raw.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in dense
    ):
        raise ValueError(
            f"mlp_only_layers must be a list of layer indices in [0, {layers}), got {dense!r}"
        )
    sparse = tuple(
        i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0
    )
    return MoeConfig(experts, top_k, width, bool(norm), sparse)
