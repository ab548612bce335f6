"""Top-p taken on the full softmax, before top-k's survivors are renormalized.

The two cuts are computed side by side on the unfiltered row: the nucleus then holds more tokens
than it should whenever top-k removed mass (top-2 of [0.4, 0.3, 0.2, 0.1] with top-p 0.5 keeps
both tokens, where 0.4 / 0.7 alone already reaches 0.5).
"""


def top_k_top_p_filter(logits, top_k, top_p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    probs = sorted_logits.softmax(dim=-1)  # the bug: before top-k, so not renormalized
    mass_before = probs.cumsum(dim=-1) - probs
    cut = (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1.0)
    cut |= ranks >= top_k.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
