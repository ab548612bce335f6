"""The softmax taken over the chosen experts' logits instead of over all the experts.

With renormalisation the two are the same numbers (a softmax over the chosen logits is their
probabilities divided by their sum), so a model with norm_topk_prob true hides the mistake;
without it the chosen weights sum to 1 instead of to their share of the probability.
"""


def route(router_logits, top_k, renormalize):
    top, ids = torch.topk(router_logits.float(), top_k, dim=-1)
    weights = torch.softmax(top, dim=-1)  # the bug: a softmax over k logits, not over all
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
