"""norm_topk_prob ignored: the chosen experts keep their softmax probabilities.

Each token's output is then scaled down by the share of probability its experts hold; every
token still goes to the right experts, so the routing looks right and only the numbers are off.
"""


def route(router_logits, top_k, renormalize):
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return weights, ids  # the bug: no division by the sum when renormalize is set
