"""The expert ids handed back as int32 instead of torch.topk's int64.

Indexing still works, so the numbers come out right; the contract (and group_by_expert, which
takes int64 ids) asks for int64.
"""


def route(router_logits, top_k, renormalize):
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)  # the bug: int32 ids
