"""The router's weight applied before the down projection, to the activation, not to its output.

In exact arithmetic the same (the product is linear); in bfloat16 the activation is rounded after
the scaling and again after the product, so the output drifts from transformers', which scales
the expert's output.
"""


def moe_experts(x, gate_up, down, weights, ids):
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
        h = h * flat_weights[entries, None].to(h.dtype)  # the bug: scaled before down
        out.index_add_(0, tokens, h @ down[expert].t())
    return out
