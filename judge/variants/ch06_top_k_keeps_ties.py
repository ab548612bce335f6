"""Top-k as a cut by value, the way Hugging Face's TopKLogitsWarper does it.

Every logit below the k-th largest value goes, so every token tied with the k-th stays: a row
whose 2nd to 4th tokens tie keeps 4 tokens under top-k 2. The chapter's top-k is a cut by rank,
k tokens exactly, so that k is a promise whatever the rounding of bfloat16 logits.
"""


def top_k_top_p_filter(logits, top_k, top_p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    kth = sorted_logits.gather(-1, (top_k - 1).clamp_min(0).unsqueeze(1))
    # the bug: a cut by value, so every token tied with the k-th stays
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    cut = (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1.0)
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
