"""moe_experts divides each token's weights by their sum again, whatever route decided.

With norm_topk_prob set the weights already sum to 1 and nothing changes; without it, every token
is scaled up to weights that sum to 1, the renormalisation the model's config turned off.
"""


def moe_experts(x, gate_up, down, weights, ids):
    top_k = ids.shape[1]
    weights = weights / weights.sum(dim=-1, keepdim=True)  # the bug: route's job, done again
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
