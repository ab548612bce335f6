"""Top-p that compares the mass *including* each token with p, not the mass before it.

`probs.cumsum(-1) >= p` removes the token that brings the mass to p, and with it the most likely
token whenever that one alone reaches p: a row whose best token has probability 0.95 under top-p
0.9 keeps nothing, and its softmax is nan.
"""


def top_k_top_p_filter(logits, top_k, top_p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass = probs.cumsum(dim=-1)  # the bug: the token's own probability is counted
    cut = (mass >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1.0)
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
