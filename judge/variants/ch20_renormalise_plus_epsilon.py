"""The renormalisation divides by the sum plus 1e-6, "to be safe".

The sum of softmax probabilities is never zero, so the epsilon protects nothing: it only makes
the weights add up to a little less than 1 (a single expert weighs 0.999999, not 1).
"""


def route(router_logits, top_k, renormalize):
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)  # the bug: + 1e-6
    return weights, ids
