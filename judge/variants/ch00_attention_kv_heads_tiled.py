"""Grouped-query attention that tiles the key/value heads instead of repeating each one.

`k.repeat(1, group, 1)` gives the order kv0, kv1, ..., kv0, kv1, ...: query head 1 reads kv head 1
instead of kv head 0. Query head h must use kv head h // group, which `repeat_interleave` gives.
"""


def attention(q, k, v):
    q_len, num_heads, head_dim = q.shape
    k_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.repeat(1, group, 1)  # the bug: tiled, not interleaved
    v = v.repeat(1, group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    q_pos = torch.arange(k_len - q_len, k_len, device=q.device).unsqueeze(1)
    k_pos = torch.arange(k_len, device=q.device).unsqueeze(0)
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
