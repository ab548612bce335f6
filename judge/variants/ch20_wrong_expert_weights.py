"""The experts that got tokens numbered 0, 1, 2, ... as they come, skipping the empty ones.

When every expert has tokens this is right; as soon as one expert gets none, every expert after
it runs with the weights of the expert before it.
"""


def moe_experts(x, gate_up, down, weights, ids):
    top_k = ids.shape[1]
    order, counts = group_by_expert(ids, gate_up.shape[0])
    flat_weights = weights.reshape(-1)
    out = torch.zeros_like(x)
    start = 0
    used = [c for c in counts.tolist() if c > 0]
    for expert, count in enumerate(used):  # the bug: the index of a used expert, not its id
        entries = order[start : start + count]
        start += count
        tokens = entries // top_k
        h = silu_and_mul(x[tokens] @ gate_up[expert].t())
        y = h @ down[expert].t()
        out.index_add_(0, tokens, y * flat_weights[entries, None].to(y.dtype))
    return out
