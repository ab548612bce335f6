"""Every expert runs, the ones no token chose included, on an empty selection of tokens.

The numbers are right (a product over no rows adds nothing), but each unused expert still costs
its products, and on a GPU its launches: the grouping exists so that unused experts cost nothing.
"""


def moe_experts(x, gate_up, down, weights, ids):
    top_k = ids.shape[1]
    order, counts = group_by_expert(ids, gate_up.shape[0])
    flat_weights = weights.reshape(-1)
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts.tolist()):  # the bug: no skip for count == 0
        entries = order[start : start + count]
        start += count
        tokens = entries // top_k
        h = silu_and_mul(x[tokens] @ gate_up[expert].t())
        y = h @ down[expert].t()
        out.index_add_(0, tokens, y * flat_weights[entries, None].to(y.dtype))
    return out
