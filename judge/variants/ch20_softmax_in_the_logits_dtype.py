"""The softmax computed in the logits' dtype and only its result turned into float32.

In float32 nothing changes; with bfloat16 logits the probabilities are rounded to three digits
before the top-k and the renormalisation, where transformers computes the softmax in float32.
"""


def route(router_logits, top_k, renormalize):
    probs = torch.softmax(router_logits, dim=-1).float()  # the bug: the softmax in bfloat16
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
