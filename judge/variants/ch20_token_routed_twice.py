"""Top-k by taking the argmax k times without removing the expert already chosen.

Every choice of a token is then its best expert: the token is routed to it k times, with its
probability each time, and never to its second-best expert.
"""


def route(router_logits, top_k, renormalize):
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = [], []
    for _ in range(top_k):
        best = probs.argmax(dim=-1, keepdim=True)  # the bug: the chosen expert is not masked out
        ids.append(best)
        weights.append(probs.gather(1, best))
    weights, ids = torch.cat(weights, dim=1), torch.cat(ids, dim=1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
