"""Top-k/top-p filter that applies the nucleus cut to every row, also where top-p is 1.0 (off).

`mass_before >= top_p` alone: in float32 the running total of a softmax over 4096 tokens reaches
1.0 before the vocabulary ends, so a row that asked for no nucleus loses its tail (332 tokens of
the logits after `ROMEO:\\n`). Samples rarely show it; "off" is no longer off.
"""


def top_k_top_p_filter(logits, top_k, top_p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    cut = mass_before >= top_p.unsqueeze(1)  # the bug: a top-p of 1.0 is cut too
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
