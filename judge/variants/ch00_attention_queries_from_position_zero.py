"""Causal attention that places query i at position i, not at the last q_len positions.

Right for a full sequence (q_len == k_len), wrong as soon as a cache holds earlier keys: the one
query of a decode step sits at position 0 and sees only the first key, so every token after the
prefill is predicted from the first token alone.
"""


def attention(q, k, v):
    q_len, num_heads, head_dim = q.shape
    k_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    q_pos = torch.arange(q_len, device=q.device).unsqueeze(1)  # the bug: not k_len - q_len + i
    k_pos = torch.arange(k_len, device=q.device).unsqueeze(0)
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
