"""A mixture-of-experts MLP in plain torch: route each token to its top-k experts, group the
(token, expert) pairs by expert, run each expert once on all of its tokens, and add the results
back weighted by the router.

The experts' weights are stacked: `gate_up` [experts, 2 * inter, hidden] (each expert's gate rows
above its up rows, as transformers 5 stores them) and `down` [experts, hidden, inter]. One expert
is then the dense SwiGLU MLP: down(silu(gate(x)) * up(x)).

`moe_experts` is the grouped path: one matrix product per expert that has tokens, so a step reads
only the weights of the experts it uses. It asks the host how many tokens each expert got, which a
CUDA graph cannot record; `moe_experts_dense` is the path a graph captures: every expert on every
token, weighted 0 where the router did not choose it.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .ops import silu_and_mul


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Choose each token's experts and their weights from the router's logits.

    The router's probabilities are a softmax over all the experts; a token goes to the `top_k`
    most probable ones, each weighted by its probability. With `renormalize` (a config's
    norm_topk_prob) the chosen weights are divided by their sum, so they add up to 1; without it
    they keep the probabilities the softmax gave them, which add up to less.

    Receives: `router_logits` [tokens, experts], any float dtype; `top_k`, 1 <= top_k <= experts;
        `renormalize`, a bool.
    Returns: (weights, ids): weights [tokens, top_k] float32, ids [tokens, top_k] int64, the
        experts in order of falling probability, each expert at most once per token. Between
        experts of equal probability the order is not fixed (torch.topk, which transformers
        uses, leaves it unspecified): a tie at the cut may keep either one.
    Leaves: nothing changed (a pure function).
    Uses: only torch; the softmax in float32, as transformers computes it.
    Checked: equals transformers' router with and without renormalisation; weights are the
        softmax over all experts, not over the chosen ones, computed in float32 also for bfloat16
        logits; ids are int64; no expert twice in a row, a tie at the cut included; one expert
        (top_k 1) renormalised weighs exactly 1.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def group_by_expert(ids: torch.Tensor, num_experts: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sort the router's choices by expert, so each expert's tokens sit side by side.

    Each token makes top_k choices; flattened row by row, choice j of token t is entry
    t * top_k + j. Sorting those entries by expert gives, for each expert in turn, the choices
    that picked it: expert 0's first, then expert 1's, and so on.

    Receives: `ids` [tokens, top_k] int64, experts in [0, num_experts); `num_experts`.
    Returns: (order, counts): order [tokens * top_k] int64, the flat entries sorted by expert
        (entries of one expert in rising order, a stable sort); counts [num_experts] int64, how
        many entries each expert got (zero for an unused expert). The token of entry i is
        i // top_k.
    Leaves: nothing changed (a pure function).
    Uses: only torch.
    Checked: order is a permutation grouping each expert's entries, in rising order; counts sum
        to tokens * top_k and match each expert's entries; an expert nobody chose counts 0.
    """
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


def moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """The MoE layer's output: each token's chosen experts, weighted and summed.

    A token's row is the sum over its choices of the router's weight times that expert's SwiGLU
    MLP applied to the token. Each expert with tokens runs once, as one matrix product over all
    the tokens that chose it (found with `group_by_expert`); an expert no token chose is skipped,
    its weights unread. A token's result from an expert is scaled by the router's weight for that
    choice, in x's dtype, and added to the token's row of the output.

    Receives: `x` [tokens, hidden]; `gate_up` [experts, 2 * inter, hidden], expert e's gate rows
        then up rows; `down` [experts, hidden, inter]; `weights` [tokens, top_k] (float32, from
        `route`); `ids` [tokens, top_k] int64.
    Returns: a new tensor [tokens, hidden] in x's dtype (zeros for zero tokens).
    Leaves: x, the weights and the routing unchanged.
    Uses: `group_by_expert` (this chapter); `silu_and_mul` from `minisgl.kernel`, the dense MLP's
        gate ([gate | up] side by side -> silu(gate) * up, as in minisgl/models/decoder.py).
    Checked: equals transformers' experts on random tokens and routings, in float32 and (scaling
        each expert's output after the down projection) in bfloat16; each choice uses its own
        expert's weights and its own weight, as given (weights that do not sum to 1 are not
        renormalised here); each used expert runs once over all its tokens; an unused expert
        runs no product at all; zero tokens give a [0, hidden] output.
    """
    top_k = ids.shape[1]
    order, counts = group_by_expert(ids, gate_up.shape[0])
    flat_weights = weights.reshape(-1)
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        entries = order[start : start + count]
        start += count
        tokens = entries // top_k
        h = silu_and_mul(x[tokens] @ gate_up[expert].t())
        y = h @ down[expert].t()
        out.index_add_(0, tokens, y * flat_weights[entries, None].to(y.dtype))
    return out


def moe_experts_dense(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """`moe_experts` without asking the host anything (for CUDA graph capture): every expert runs
    on every token and its result is scaled by the router's weight, 0 for an expert not chosen.
    Same result; experts / top_k times the work."""
    combine = torch.zeros(x.shape[0], gate_up.shape[0], dtype=weights.dtype, device=x.device)
    combine.scatter_(1, ids, weights)
    out = torch.zeros_like(x)
    for expert in range(gate_up.shape[0]):
        y = silu_and_mul(x @ gate_up[expert].t()) @ down[expert].t()
        out += y * combine[:, expert, None].to(y.dtype)
    return out
